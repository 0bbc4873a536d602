"""GET /v1/models: the model this gateway serves (one engine, one model)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency, Provide

from gateway.apikeys import ApiKey
from gateway.auth import BEARER, require_role
from gateway.completion import Completions
from gateway.errors import documented
from gateway.schemas import ModelCard, ModelList


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["models"]
    dependencies = {"principal": Provide(require_role("agent"))}
    security = BEARER

    @get("", summary="List the served models", responses=documented())
    async def list_models(
        self, principal: NamedDependency[ApiKey], completions: NamedDependency[Completions]
    ) -> ModelList:
        identity = completions.engine.identity
        return ModelList(
            data=[
                ModelCard(id=identity.model, created=completions.started_at, owned_by="callproof")
            ]
        )
