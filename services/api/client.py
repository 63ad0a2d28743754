"""The operator's client of the control plane, over REST (what ``streamrec up`` and tests use)."""

from __future__ import annotations

from typing import Any

import httpx
from streamrec.errors import RemoteError, ServiceUnavailable

__all__ = ["ApiClient"]


class ApiClient:
    """A small REST client of the control plane (``/v1``) with a bearer token."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"{method} {path}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = resp.text[:500]
            raise RemoteError(str(resp.status_code), f"{method} {path}: {detail}")
        return resp.json() if resp.content else None

    def ready(self) -> bool:
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def create_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=spec)

    def action(self, job_id: str, action: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/{action}")

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def passes(self, job_id: str, limit: int = 1000) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/passes", params={"limit": limit})["data"]

    def events(self, job_id: str, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self._call("GET", f"/v1/jobs/{job_id}/events", params=params)

    def trigger(self, job_id: str, kind: str, mode: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/triggers", json={"kind": kind, "mode": mode})
