"""GET /v1/models and /v1/models/{model}: the model this gateway serves (one engine, one
model)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.auth import BEARER, require_role
from gateway.completion import Completions
from gateway.errors import documented, model_not_served
from gateway.schemas import ModelCard, ModelList


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["models"]
    guards = [require_role("agent")]
    security = BEARER

    @get("", summary="List the served models", responses=documented())
    async def list_models(self, completions: NamedDependency[Completions]) -> ModelList:
        return ModelList(data=[_card(completions)])

    @get("/{model:path}", summary="One served model", responses=documented())
    async def retrieve_model(
        self,
        completions: NamedDependency[Completions],
        model: FromPath[str],
    ) -> ModelCard:
        card, requested = _card(completions), model.lstrip("/")
        if requested != card.id:
            raise model_not_served(requested, card.id)
        return card


def _card(completions: Completions) -> ModelCard:
    model = completions.engine.identity.model
    return ModelCard(id=model, created=completions.started_at, owned_by="callproof")
