import sys

from services.common.grpc_server import run, setup_logging
from services.common.metrics import serve_metrics
from services.preprocessor.config import parse_config
from services.preprocessor.server import serve

cfg = parse_config(sys.argv[1:])
setup_logging(cfg.log_level)
serve_metrics(cfg.metrics_port, cfg.host)
run(lambda: serve(cfg))
