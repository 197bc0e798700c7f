"""Builds the all-in-one process: every stage by its own ``build``, the gateway over in-process clients."""

from __future__ import annotations

import dataclasses

from prometheus_client import REGISTRY, CollectorRegistry

from services.allinone.clients import InProcessPostprocessor, InProcessPreprocessor, InProcessRouter
from services.allinone.config import AllInOneConfig
from services.common import tls as mesh_tls
from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.gateway import assembly as gateway_assembly
from services.gateway import frontend_metrics
from services.gateway.assembly import Gateway
from services.postprocessor import assembly as postprocessor_assembly
from services.postprocessor.service import Postprocessor
from services.preprocessor import assembly as preprocessor_assembly
from services.preprocessor.service import Preprocessor
from services.router import assembly as router_assembly
from services.router.service import Router


@dataclasses.dataclass
class AllInOne:
    gateway: Built[Gateway]
    preprocessor: Built[Preprocessor]
    router: Built[Router]
    postprocessor: Built[Postprocessor]

    def start(self) -> None:
        for stage in (self.preprocessor, self.router, self.postprocessor, self.gateway):
            stage.start()

    async def close(self) -> None:
        """After the server stopped: the gateway, then the stages it called."""
        for stage in (self.gateway, self.postprocessor, self.router, self.preprocessor):
            await stage.close()


def build(cfg: AllInOneConfig, registry: WorkerRegistry, tls: mesh_tls.MeshTls | None = None,
          metrics_registry: CollectorRegistry = REGISTRY) -> AllInOne:
    """Every stage from its own config over one worker registry (the caller starts it after building).

    Raises ``ChatProcessorUnavailable`` as the postprocessor's build does.
    """
    preprocessor = preprocessor_assembly.build(cfg.preprocessor, registry)
    router = router_assembly.build(cfg.router, registry, metrics_registry)
    # Migrations ask the in-process router, as the split postprocessor asks the router service.
    postprocessor = postprocessor_assembly.build(cfg.postprocessor, registry, tls, router=router.service)
    gateway = gateway_assembly.build(cfg.gateway, registry, tls,
                                     preprocessor=InProcessPreprocessor(preprocessor.service),
                                     router=InProcessRouter(router.service),
                                     postprocessor=InProcessPostprocessor(postprocessor.service))
    # The postprocessor is in this process: Dynamo's model_migration_limit can say its --migration-limit.
    frontend_metrics.recorder().watch(registry.models, cfg.postprocessor.migration_limit)
    return AllInOne(gateway, preprocessor, router, postprocessor)
