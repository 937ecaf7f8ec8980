"""What the demo (and ``faro-serve run``) reads of a ``serve_config.yaml`` before starting
it: the HTTP address load is sent to, the Ray dashboard port the autoscaler reaches, and the
autoscaler's models, SLOs and capacity, each checked with the flag and file named in the
error. Apart from starting and stopping the deployment (``faro_serve.demo.deployment``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

AUTOSCALER_IMPORT = "faro_serve.serving.app:autoscaler_app"


@dataclass
class ServeTarget:
    """What the demo needs from a ``serve_config.yaml``."""

    config: Path
    url: str  # http://127.0.0.1:<http_options.port>
    http_port: int
    dashboard_port: int  # of the faro app's dashboard_url
    models: list[str] = field(default_factory=list)  # the autoscaler's models (SLO entries)
    slos: list = field(default_factory=list)  # their ModelSLO entries
    capacity_cpus: float = 0.0  # the autoscaler's cluster capacity


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_config(path: str | Path, loopback_only: bool = True) -> ServeTarget:
    """The HTTP address, dashboard port and models of a Serve config (``ValueError`` if
    unusable). ``loopback_only``: the demo sends load, so to this machine only."""
    import yaml

    from ..config import ConfigError
    from ..serving.schema import check_resources, parse_autoscaler_config, parse_model_args

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {p}: no such file")
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"--config {p}: cannot read YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("applications"), list):
        raise ValueError(f"--config {p}: not a Serve config (no 'applications' list)")
    http = doc.get("http_options") or {}
    host = str(http.get("host", "127.0.0.1"))
    port = http.get("port", 8000)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"--config {p}: http_options.port must be a port number (got {port!r})")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # listens everywhere, loopback included
    if loopback_only and not _loopback(host):
        raise ValueError(
            f"--config {p}: http_options.host {host} is not a loopback address; "
            f"the demo sends load to this machine only"
        )
    apps = [a for a in doc["applications"] if isinstance(a, dict)]
    faro = [a for a in apps if str(a.get("import_path", "")) == AUTOSCALER_IMPORT]
    if len(faro) != 1:
        raise ValueError(
            f"--config {p}: needs exactly one application with import_path {AUTOSCALER_IMPORT} (found {len(faro)})"
        )
    cfg = parse_autoscaler_config(faro[0].get("args") or {}, f"{p}: faro application args")
    try:  # each model application's cpus must be its SLO's (the planner counts the SLO's)
        check_resources(
            cfg,
            [
                parse_model_args(a.get("args"), f"{p}: application {a.get('name')!r} args")
                for a in apps
                if str(a.get("import_path", "")).endswith(":model_app")
            ],
            f"--config {p}",
        )
    except ConfigError as err:
        raise ValueError(" ".join(str(err).split())) from None
    dash = urlsplit(cfg.dashboard_url)
    if not dash.hostname or not _loopback(dash.hostname) or not dash.port:
        raise ValueError(
            f"--config {p}: the demo starts Ray locally, so dashboard_url must be a "
            f"loopback address with a port (got {cfg.dashboard_url})"
        )
    url_host = f"[{host}]" if ":" in host else host
    return ServeTarget(
        config=p,
        url=f"http://{url_host}:{port}",
        http_port=port,
        dashboard_port=dash.port,
        models=[m.name for m in cfg.models],
        slos=list(cfg.models),
        capacity_cpus=float(cfg.cluster.cpus),
    )
