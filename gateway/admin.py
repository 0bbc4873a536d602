"""Key management over HTTP (admin keys only): the same operations as `callproof keys`."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, delete, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.apikeys import ApiKey, InvalidKeyField, KeyNotFound, KeyStore, log_key_change
from gateway.auth import BEARER, Authenticator, KeyCall, require_role
from gateway.bodies import StrictBody
from gateway.errors import BODY_ERRORS, APIError, documented
from gateway.query import shaped
from gateway.schemas import CreatedKey, KeyCreate, KeyInfo
from gateway.shapes import API_KEY_ID


def _info(key: ApiKey) -> KeyInfo:
    return msgspec.convert(key.as_json(), KeyInfo)


class AdminKeysController(Controller):
    path = "/admin/keys"
    tags = ["admin"]
    guards = [require_role("admin", strict_query=True)]
    security = BEARER

    @get("", summary="List API keys (never their secrets)", responses=documented())
    async def list_keys(
        self, keys: NamedDependency[KeyStore], key_call: NamedDependency[KeyCall]
    ) -> list[KeyInfo]:
        return [_info(key) for key in await key_call(keys.list)]

    @post(
        "",
        summary="Create an API key; the secret is returned once",
        responses=documented(*BODY_ERRORS),
        dto=StrictBody[KeyCreate],
        return_dto=None,
    )
    async def create_key(
        self,
        principal: NamedDependency[ApiKey],
        keys: NamedDependency[KeyStore],
        key_call: NamedDependency[KeyCall],
        data: JSONBody[KeyCreate],
    ) -> CreatedKey:
        try:
            key, secret = await key_call(keys.create, data.role, data.tenant, data.name)
        except InvalidKeyField as exc:
            raise APIError(400, str(exc), code="invalid_value", param=exc.param) from None
        log_key_change("api key created", key, principal.id)
        return CreatedKey(key=_info(key), secret=secret)

    @delete(
        "/{key_id:str}",
        status_code=200,
        summary="Revoke an API key",
        description=(
            "Answers the key as revoked. A key already revoked is answered as it is, with the"
            " `revoked_at` of its revocation, and nothing is logged: revoking is idempotent, so"
            " a retried DELETE is not an error."
        ),
        responses=documented(),
    )
    async def revoke_key(
        self,
        principal: NamedDependency[ApiKey],
        keys: NamedDependency[KeyStore],
        key_call: NamedDependency[KeyCall],
        authenticator: NamedDependency[Authenticator],
        key_id: Annotated[str, shaped(API_KEY_ID)],
    ) -> KeyInfo:
        try:
            revoked, now = await key_call(keys.revoke, key_id)
        except KeyNotFound as exc:
            raise APIError(404, str(exc), code="not_found", param="key_id") from None
        authenticator.forget(key_id)
        if now:
            log_key_change("api key revoked", revoked, principal.id)
        return _info(revoked)
