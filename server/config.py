"""Engine and server settings as plain dataclasses, with vLLM-style names."""

import dataclasses
import json
import re
from dataclasses import dataclass

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6, "MIB": 2**20,
          "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12, "TIB": 2**40}


def parse_bytes(text: str | int) -> int:
    """``"2GiB"``, ``"512MB"``, ``"1.5G"`` or a plain number of bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 2GiB or 512MB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
# vLLM's names: fp8 is fp8_e4m3 (finer steps); fp8_e5m2 has a wider range. Neither takes scales.
KV_CACHE_DTYPE_CHOICES = (*DTYPE_CHOICES, "fp8", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("int8", "int4")
# How steps run (server/engine/execution_plan.py): "auto" takes the one-call loop wherever it can.
DECODE_PATHS = ("auto", "one-call", "cuda-graphs", "layer-loop")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config``: ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
    "prompt_lookup_min": 2}``. Only the n-gram (prompt lookup) method runs today.

    Matches of at least two tokens by default: on the shipped repetitive prompts (bench spec, two Xeon cores) a
    minimum of 1 accepted 47% of the drafts (1.56x), a minimum of 2 accepted 71% (1.84x); where no two-token match
    exists the step simply decodes."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative method {self.method!r} is not supported (ngram is)")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max")

    @classmethod
    def parse(cls, text: str, where: str = "--speculative-config") -> "SpeculativeConfig":
        """From the flag's JSON; raises ValueError naming what is wrong."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not JSON: {error}") from None
        return cls.from_dict(fields, where)

    @classmethod
    def from_dict(cls, fields: object, where: str = "speculative_config") -> "SpeculativeConfig":
        """From vLLM's dict (``LLM(speculative_config={...})``); raises ValueError naming what is wrong."""
        if not isinstance(fields, dict):
            raise ValueError(f"{where} must be a JSON object (a dict)")
        known = {field.name for field in dataclasses.fields(cls)}
        if unknown := set(fields) - known:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        if not all(isinstance(value, str if name == "method" else int) and not isinstance(value, bool)
                   for name, value in fields.items()):
            raise ValueError(f"{where}: method is a string, the other keys integers")
        fields = dict(fields)
        if "prompt_lookup_max" in fields and "prompt_lookup_min" not in fields:
            fields["prompt_lookup_min"] = min(cls.prompt_lookup_min, fields["prompt_lookup_max"])
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


@dataclass
class EngineConfig:
    model: str | None = None
    dtype: str = "auto"
    weight_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    tensor_parallel_size: int = 1
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    kv_cache_memory: int = 2 * 2**30
    gpu_memory_utilization: float = 0.9
    max_queue_len: int = 1024
    enable_prefix_caching: bool = True
    quantization: str | None = None
    speculative_config: SpeculativeConfig | None = None
    stop_on_repetition: bool = False
    batch_invariant: bool = False
    decode_path: str = "auto"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        # vLLM's LLM(...) takes these as a dict or JSON text, and dtypes as torch dtypes or "half" and "float".
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        elif isinstance(self.speculative_config, str):
            self.speculative_config = SpeculativeConfig.parse(self.speculative_config, "speculative_config")
        elif not isinstance(self.speculative_config, SpeculativeConfig | None):
            raise ValueError("speculative_config must be a dict such as {\"method\": \"ngram\", "
                             "\"num_speculative_tokens\": 4}")
        for name in ("dtype", "weight_dtype", "kv_cache_dtype"):
            setattr(self, name, _dtype_name(getattr(self, name)))
        for name in ("dtype", "weight_dtype"):
            if getattr(self, name) not in DTYPE_CHOICES:
                raise ValueError(f"{name} must be auto, float32, bfloat16 or float16, not {getattr(self, name)!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_CHOICES)}, "
                             f"not {self.kv_cache_dtype!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {self.quantization!r}")
        if self.batch_invariant and self.quantization is not None:
            raise ValueError("batch-invariant mode takes no quantization: the quantized kernels sum a row "
                             "differently at different row counts")
        if self.decode_path not in DECODE_PATHS:
            raise ValueError(f"decode_path must be one of {', '.join(DECODE_PATHS)}, not {self.decode_path!r}")
        if self.block_size not in (8, 16, 32):
            raise ValueError("block_size must be 8, 16 or 32")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_queue_len", "kv_cache_memory",
                     "tensor_parallel_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True)
class JWTConfig:
    """Accept JWTs signed by the keys of ``jwks`` (a file path or an http(s) URL), read again every
    ``refresh_s`` seconds; the claim ``tenant_claim`` names the caller's tenant."""

    jwks: str
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "sub"
    leeway_s: float = 30.0
    refresh_s: float = 300.0


@dataclass(frozen=True)
class TLSConfig:
    """HTTPS, as uvicorn and vLLM name its settings; ``cert_reqs`` is ssl.CERT_NONE (0), CERT_OPTIONAL (1) or
    CERT_REQUIRED (2) for client certificates signed by ``ca_certs``."""

    keyfile: str
    certfile: str
    ca_certs: str | None = None
    cert_reqs: int = 0


@dataclass
class ServerConfig:
    """The HTTP server's settings; the engine's are in EngineConfig."""

    served_model_name: str = "SmolLM2-135M-Instruct"
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    jwt: JWTConfig | None = None
    metrics_require_api_key: bool = False
    # With authentication on, requests share prefix-cache blocks only within their tenant unless this is set.
    share_prefix_cache_across_tenants: bool = False
    rate_limit_rpm: int | None = None
    rate_limit_tpm: int | None = None
    max_request_bytes: int = 4 * 2**20
    max_header_bytes: int = 16 * 2**10
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    tls_handshake_timeout: float = 10.0
    max_connections: int = 1024
    # 0: no cap per address (behind a proxy, every connection comes from the proxy's address).
    max_connections_per_client: int = 128
    tls: TLSConfig | None = None
    shutdown_timeout: float = 30.0
    # HAProxy's agent check (server/api/agent_check.py) listens here when set.
    agent_port: int | None = None
    # How tool calls are read out of the model's text (a name in server/api/tool_parsers), as vLLM's flag.
    tool_call_parser: str = "hermes"

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")
        for name in ("port", "agent_port"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be in [0, 65535]")
        for name in ("rate_limit_rpm", "rate_limit_tpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive")
        for name in ("max_request_bytes", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must not be negative")
        if min(self.header_timeout, self.body_timeout, self.tls_handshake_timeout) <= 0 or self.max_connections < 1:
            raise ValueError("header_timeout, body_timeout, tls_handshake_timeout and max_connections must be positive")
        if self.max_connections_per_client < 0:
            raise ValueError("max_connections_per_client must not be negative (0: no cap per address)")
        if self.tls is not None and self.tls.cert_reqs not in (0, 1, 2):
            raise ValueError("ssl_cert_reqs must be 0 (none), 1 (optional) or 2 (required)")
        if self.tls is not None and self.tls.cert_reqs and not self.tls.ca_certs:
            raise ValueError("client certificates (--ssl-cert-reqs) need --ssl-ca-certs")
        if any(not key or not key.isascii() or not key.isprintable() for key in self.api_keys):
            raise ValueError("API keys must be non-empty printable ASCII")


_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _dtype_name(dtype: object) -> object:
    """A torch dtype (torch.bfloat16) or one of vLLM's aliases ("half") as the name the config takes; anything
    else as it is, for the checks below to judge."""
    name = str(dtype).removeprefix("torch.") if type(dtype).__name__ == "dtype" else dtype
    return _DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name
