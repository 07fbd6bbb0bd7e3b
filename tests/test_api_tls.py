"""HTTPS with certificates made here: the server proves itself to clients that trust its CA, and with
--ssl-cert-reqs 2 a client must prove itself too."""

import datetime
import ipaddress
import ssl
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.api_server import READY_TIMEOUT_S, APIServer

pytestmark = pytest.mark.server


def issue(name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, usage: list, san: bool = False):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if san:
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        builder = builder.add_extension(x509.SubjectAlternativeName([loopback]), critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def write(folder: Path, stem: str, key, cert) -> tuple[Path, Path]:
    key_path, cert_path = folder / f"{stem}.key", folder / f"{stem}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = issue("Vigil test CA", None, [])
    signer = (ca_cert.subject, ca_key)
    return {
        "ca": write(folder, "ca", ca_key, ca_cert),
        "server": write(folder, "server", *issue("127.0.0.1", signer, [ExtendedKeyUsageOID.SERVER_AUTH], san=True)),
        "client": write(folder, "client", *issue("a client", signer, [ExtendedKeyUsageOID.CLIENT_AUTH])),
    }


def https_ready(server: APIServer, **client: object) -> str:
    url = f"https://127.0.0.1:{server.port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.log_tail()
        try:
            if httpx.get(f"{url}/readyz", timeout=5, **client).status_code == 200:
                return url
        except httpx.TransportError:
            time.sleep(0.25)
    raise TimeoutError(server.log_tail())


def test_https_with_a_client_certificate_required(smollm_folder, pki):
    (server_key, server_cert), (_, ca_cert), client = pki["server"], pki["ca"], pki["client"]
    server = APIServer(smollm_folder, "--ssl-keyfile", str(server_key), "--ssl-certfile", str(server_cert),
                       "--ssl-ca-certs", str(ca_cert), "--ssl-cert-reqs", "2")
    try:
        trusted = {"verify": ssl.create_default_context(cafile=str(ca_cert))}
        trusted["verify"].load_cert_chain(str(client[1]), str(client[0]))
        url = https_ready(server, **trusted)
        body = {"model": "smollm", "prompt": "Hi", "max_tokens": 1}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60, **trusted).status_code == 200
        with pytest.raises(httpx.ConnectError):  # the server's certificate is not one the system trusts
            httpx.get(f"{url}/livez", timeout=10)
        anonymous = ssl.create_default_context(cafile=str(ca_cert))
        with pytest.raises(httpx.TransportError):  # no client certificate: the handshake fails
            httpx.get(f"{url}/livez", timeout=10, verify=anonymous)
        with pytest.raises(httpx.TransportError):  # plain HTTP on the HTTPS port gets no answer
            httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=10)
    finally:
        server.stop()
