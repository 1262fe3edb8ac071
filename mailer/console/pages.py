"""The console's pages (GET): overview, tenants, one tenant, one job, dead letters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from fairpost.config.limits import format_limits
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.dispatcher.errors import UnknownJob
from fairpost.mailer.console.auth import Handler
from fairpost.mailer.console.charts import day_bars, minute_chart, minute_limit
from fairpost.mailer.console.context import AUTH, CONSOLE, render
from fairpost.mailer.console.data import TenantCharts
from fairpost.mailer.console.tenants import SORTS
from fairpost.mailer.console.views import chart

__all__ = ["add_routes"]

MAX_JOB_ID = 200


def add_routes(get: Callable[[str, Handler], None]) -> None:
    get("/", overview)
    get("/fragments/overview", overview_live)
    get("/tenants", tenants)
    get("/tenants/{tenant}", tenant)
    get("/fragments/tenants/{tenant}/charts", tenant_charts)
    get("/jobs", find_job)
    get("/jobs/{job_id}", job)
    get("/dead", dead)
    get("/dead/confirm", confirm)


async def _overview_context(request: web.Request) -> dict[str, Any]:
    console = request.app[CONSOLE]
    view = await console.overview()
    backlog = console.backlog
    return {
        "view": view,
        "minutes": minute_chart(view.history, minute_limit(view.stats.global_.windows)),
        "chart": chart(backlog.samples(), time.time(), backlog.span),
        "sample_seconds": backlog.every,
        "high_water": console.settings.redis_high_water,
    }


def _charts_context(charts: TenantCharts) -> dict[str, Any]:
    report = charts.report
    return {
        "charts": charts,
        "minutes": minute_chart(charts.history, minute_limit(charts.stats.windows)),
        "bars": {name: day_bars(report.days, series) for name, series in report.daily.items()},
    }


async def tenant_charts(request: web.Request) -> web.Response:
    """A tenant's charts alone, which its page fetches again every few seconds."""
    tenant_id = tenant_from(request)
    charts = await request.app[CONSOLE].tenant_charts(tenant_id)
    return render(request, "_tenant_charts.html", tenant=tenant_id, **_charts_context(charts))


async def overview(request: web.Request) -> web.Response:
    return render(request, "overview.html", title="Overview", **await _overview_context(request))


async def overview_live(request: web.Request) -> web.Response:
    """The overview's live part alone, which the page fetches again every few seconds."""
    return render(request, "overview_live.html", **await _overview_context(request))


def _page_number(request: web.Request) -> int:
    raw = request.query.get("page", "1")
    return int(raw) if raw.isdigit() and 0 < int(raw) < 10**9 else 1


async def tenants(request: web.Request) -> web.Response:
    sort = request.query.get("sort", "id")
    if sort not in SORTS:
        raise web.HTTPBadRequest(text=f"sort must be one of {', '.join(SORTS)}\n")
    pool = request.query.get("pool", "")
    names = request.app[CONSOLE].pools.names()
    if pool and pool not in names:
        raise web.HTTPBadRequest(text=f"pool must be one of {', '.join(names) or '(no pools declared)'}\n")
    listing = await request.app[CONSOLE].tenants.page(
        query=request.query.get("q", "")[:64],
        sort=sort,
        page=_page_number(request),
        pool=pool,
    )
    return render(request, "tenants.html", title="Tenants", listing=listing, sorts=SORTS)


_DOT_IDS = frozenset({".", ".."})
DOT_MARK = "~"
"""Before a tenant id that is a dot segment, in its path (a tenant id never holds ``~``)."""


def tenant_path(tenant: str, rest: str = "") -> str:
    """The path of a tenant's page (``rest``: of one of its actions), under the prefix.

    A browser resolves a segment ``.`` or ``..`` away (percent-encoded too:
    ``%2e%2e`` is ``..`` to it), so a link to tenant ``..`` would lead to ``/``:
    those two ids are written ``~.`` and ``~..``, and :func:`tenant_from` reads them back."""
    segment = DOT_MARK + tenant if tenant in _DOT_IDS else quote(tenant, safe="")
    return f"/tenants/{segment}{rest}"


def tenant_from(request: web.Request) -> str:
    tenant = request.match_info["tenant"]
    if tenant.startswith(DOT_MARK) and tenant[1:] in _DOT_IDS:
        tenant = tenant[1:]
    if not is_valid_tenant_id(tenant):
        raise web.HTTPNotFound(text=f"no such tenant: a tenant id is {TENANT_ID_RULE}\n")
    return tenant


async def tenant(request: web.Request) -> web.Response:
    return await tenant_page(request, tenant_from(request))


async def tenant_page(
    request: web.Request,
    tenant_id: str,
    *,
    status: int = 200,
    error: str | None = None,
    limits: str | None = None,
) -> web.Response:
    """The tenant's page; after a refused action, with the error and what was typed."""
    console = request.app[CONSOLE]
    admin = (await console.pools.of(tenant_id)).admin
    detail, own, charts = await asyncio.gather(
        console.tenant(tenant_id),
        asyncio.to_thread(admin.tenant_limits, tenant_id),
        console.tenant_charts(tenant_id),
    )
    # The form edits the tenant's own limits: a warming tenant's windows are its
    # step's where stricter, which saved as its own would outlast the warm-up.
    current = format_limits(own.windows or ())
    return render(
        request,
        "tenant.html",
        status=status,
        title=f"Tenant {tenant_id}",
        tenant=tenant_id,
        detail=detail,
        error=error,
        limits_text=current if limits is None else limits,
        ref=console.address_ref,
        warmup_settings=console.settings.warmup,
        pooled=console.pools.pooled,
        **_charts_context(charts),
    )


async def find_job(request: web.Request) -> web.StreamResponse:
    """The search box: a job id leads to its page."""
    job_id = request.query.get("id", "").strip()
    if not job_id:
        raise web.HTTPFound(request.app[AUTH].prefix + "/")
    raise web.HTTPFound(request.app[AUTH].prefix + "/jobs/" + quote(job_id, safe=""))


async def job(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    if len(job_id) > MAX_JOB_ID:
        raise web.HTTPNotFound(text="no job has this id\n")
    try:
        status = await request.app[CONSOLE].job(job_id)
    except UnknownJob:
        return render(request, "job.html", status=404, title="No such job", job_id=job_id, status_=None)
    return render(request, "job.html", title=f"Job {job_id}", job_id=job_id, status_=status)


def _dead_filter(request: web.Request) -> tuple[str, str]:
    tenant = request.query.get("tenant", "").strip()
    if tenant and not is_valid_tenant_id(tenant):
        raise web.HTTPBadRequest(text=f"tenant: a tenant id is {TENANT_ID_RULE}\n")
    return tenant, request.query.get("reason", "").strip()[:200]


async def dead(request: web.Request) -> web.Response:
    tenant_id, reason = _dead_filter(request)
    listing = await asyncio.to_thread(
        request.app[CONSOLE].dead_page, tenant_id, reason, _page_number(request)
    )
    return render(request, "dead.html", title="Dead letters", listing=listing)


async def confirm(request: web.Request) -> web.Response:
    """Replay all or Purge all: the count first, then a second button."""
    action = request.query.get("action", "")
    if action not in ("replay", "purge"):
        raise web.HTTPBadRequest(text="action must be replay or purge\n")
    tenant_id, reason = _dead_filter(request)
    letters = await asyncio.to_thread(request.app[CONSOLE].matching_dead, tenant_id, reason)
    return render(
        request,
        "confirm.html",
        title=f"{action.capitalize()} all",
        action=action,
        tenant=tenant_id,
        reason=reason,
        count=len(letters),
    )
