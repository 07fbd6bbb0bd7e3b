"""Who is calling, from the Authorization header alone: an API key, or a JWT from a trusted identity provider."""

from server.api.auth.api_keys import APIKeys
from server.api.auth.caller import ANONYMOUS, Caller
from server.api.auth.jwt_verifier import InvalidToken, JWTVerifier
from server.api.errors import APIError, invalid_request

BEARER_HINT = "send 'Authorization: Bearer <API key or JWT>'"


class Authenticator:
    def __init__(self, api_keys: APIKeys, jwt: JWTVerifier | None = None) -> None:
        self.api_keys = api_keys
        self.jwt = jwt

    @property
    def enabled(self) -> bool:
        return self.api_keys.enabled or self.jwt is not None

    async def identify(self, authorizations: list[str]) -> Caller:
        """The caller named by the request's Authorization headers (anonymous while authentication is off); raises
        an APIError: 400 for two headers, which proxies and servers may read differently, 401 otherwise."""
        if not self.enabled:
            return ANONYMOUS
        if len(authorizations) > 1:
            raise invalid_request("send one Authorization header, not several", code="duplicate_authorization")
        scheme, _, token = (authorizations[0] if authorizations else "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, f"missing or malformed credentials: {BEARER_HINT}", code="invalid_api_key")
        caller = self.api_keys.identify(token)
        if caller is not None:
            return caller
        if self.jwt is None or token.count(".") != 2:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        try:
            return await self.jwt.identify(token)
        except InvalidToken as error:
            raise APIError(401, str(error), code="invalid_api_key") from None
