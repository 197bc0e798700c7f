import sys

from services.common.grpc_server import run, setup_logging
from services.common.metrics import preprocessor_metrics, serve_metrics
from services.preprocessor.config import parse_config
from services.preprocessor.server import serve

try:
    cfg = parse_config(sys.argv[1:])
except ValueError as e:  # a bad flag value, a --chat-template that does not compile: say so and stop
    sys.exit(f"preprocessor: {e}")
setup_logging(cfg.log_level)
serve_metrics(cfg.metrics_port, cfg.host)
preprocessor_metrics()  # every documented name from the first scrape, not the first request
run(lambda: serve(cfg))
