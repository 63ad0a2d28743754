"""FastAPI dependencies as ``Annotated`` aliases: settings, Redis repository, auth.

Auth: no bearer token or a wrong one is a 401 with ``WWW-Authenticate: Bearer`` (RFC 6750:
``error="invalid_token"`` for a wrong one), on every endpoint that depends on
:data:`WriteAuth` or :data:`ReadAuth` (reads: unless ``auth_reads`` is off).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from streamrec.api.config import Settings
from streamrec.api.metrics import ApiMetrics
from streamrec.api.repo import Repo

_bearer = HTTPBearer(auto_error=False, description="the API token (STREAMREC_API_TOKEN)")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_repo(request: Request) -> Repo:
    return request.app.state.repo


def get_metrics(request: Request) -> ApiMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
RepoDep = Annotated[Repo, Depends(get_repo)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _check_token(settings: Settings, creds: HTTPAuthorizationCredentials | None) -> None:
    if settings.auth_disabled:
        return
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    assert settings.token is not None  # Settings refuses to start without one
    if not hmac.compare_digest(creds.credentials.encode(), settings.token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "invalid token",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


def require_token(settings: SettingsDep, creds: Credentials) -> None:
    """Mutating endpoints: 401 without a token or with a wrong one."""
    _check_token(settings, creds)


def require_read(settings: SettingsDep, creds: Credentials) -> None:
    """Read endpoints: as mutating ones, unless ``auth_reads`` is off."""
    if settings.auth_reads:
        _check_token(settings, creds)


WriteAuth = Depends(require_token)
ReadAuth = Depends(require_read)
