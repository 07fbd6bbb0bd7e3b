"""vLLM's tokenizer routes: POST /tokenize (a prompt, or chat messages through the template), POST /detokenize,
and GET /tokenizer_info, which lm-evaluation-harness reads to tokenize through the server."""

from fastapi import APIRouter, Depends

from server.api.auth import admit_caller
from server.api.chat_prompt import render_chat
from server.api.errors import invalid_request
from server.api.generation import check_model, in_tokenizer_pool
from server.api.logprobs import token_text
from server.api.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)
from server.api.responses import ERROR_RESPONSES
from server.api.state import ServerState, State
from server.engine.async_engine import AsyncEngine

# Tokenizing costs work: each call counts against the tenant's requests-per-minute limit.
router = APIRouter(tags=["tokenizer"], responses=ERROR_RESPONSES, dependencies=[Depends(admit_caller)])


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, state: State) -> TokenizeResponse:
    engine = check_model(state, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise invalid_request("give either prompt or messages", param="prompt")
    tokens = await in_tokenizer_pool(state, _tokenize, state, engine, body)
    token_strs = [token_text(engine.tokenizer, t) for t in tokens] if body.return_token_strs else None
    return TokenizeResponse(count=len(tokens), max_model_len=engine.max_model_len, tokens=tokens,
                            token_strs=token_strs)


def _tokenize(state: ServerState, engine: AsyncEngine, body: TokenizeRequest) -> list[int]:
    tokenizer = engine.tokenizer
    if body.messages is not None:
        text = render_chat(tokenizer, body.messages, body.tools or [], state.tool_parser,
                           add_generation_prompt=body.add_generation_prompt is not False)
        add_special_tokens = bool(body.add_special_tokens)
    else:
        text, add_special_tokens = body.prompt, body.add_special_tokens is not False
    engine.check_prompt_length(text)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, state: State) -> DetokenizeResponse:
    engine = check_model(state, body.model)
    if len(body.tokens) > engine.max_model_len:
        raise invalid_request(f"at most {engine.max_model_len} token ids (the model's context) may be detokenized",
                              param="tokens", code="context_length_exceeded")
    vocab_size = engine.vocab_size
    if not all(0 <= t < vocab_size for t in body.tokens):
        raise invalid_request(f"token ids must lie in [0, {vocab_size})", param="tokens")
    return DetokenizeResponse(prompt=await in_tokenizer_pool(state, engine.tokenizer.decode, body.tokens))


@router.get("/tokenizer_info", response_model=TokenizerInfo)
async def tokenizer_info(state: State) -> TokenizerInfo:
    tokenizer = state.engine.tokenizer
    return TokenizerInfo(bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                         chat_template=tokenizer.chat_template, model_max_length=state.engine.max_model_len)
