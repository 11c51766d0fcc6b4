"""Ray, for the work that outgrows one machine (`sweep --ray`, `validate --segments --ray`).

`connect(address)` returns the `ray` module with a session: the one already started in this
process, a cluster at `address`, or (None or "") a local instance Ray starts. Ray is an
optional extra (`pip install 'onnx2bir[ray]'`); without it, or when the cluster cannot be
reached, a `UserError` says so.
"""

from __future__ import annotations

from onnx2bir.errors import UserError


def connect(address: str | None):
    try:
        import ray
    except ImportError as exc:
        raise UserError("--ray needs Ray: pip install 'onnx2bir[ray]'") from exc
    if not ray.is_initialized():
        try:
            ray.init(address=address or None, log_to_driver=False)
        except Exception as exc:
            message = " ".join(str(exc).split())[:240]
            raise UserError(f"--ray: cannot start or reach Ray ({message})") from exc
    return ray
