"""One permission per act, for every surface: the admin, the dashboard and the REST API.

``ACTS`` maps each act an operator can do (stop the cluster, drain an agent, change engine
code, …) to the one Django permission it needs; the admin (``catalog``, ``fleet`` and
``gateway`` ``admin.py``), the dashboard's action views (``fleet.ops.views``) and the REST API
(the permission classes below, used by every view under ``/api/``) all ask :func:`can` or
:func:`permission_for`, never a permission string of their own. Plain reads and writes of a
model (list, create, change, delete a profile, …) need Django's own ``view_``/``add_``/
``change_``/``delete_`` permission of that model (:class:`StaffModelPermissions`).

The explicit permissions are declared in the models' ``Meta.permissions`` (catalog.Model,
catalog.Profile, catalog.ClusterSettings, fleet.Agent, gateway.ApiKey). Creating an agent
(which issues the token a machine joins the fleet with) and creating an API key are acts
too; their permission *is* the model's ``add_`` permission, so the admin's "Can add agent"
and the API's mean the same thing.

Tenants: a key's team, priority, limits and model budgets are part of the key — setting
them needs ``gateway.change_apikey`` like any change of a key (the admin's budget inline and
the API's ``model_budgets`` ask the key's permissions, not the budget model's); teams and
their budgets are plain model reads and writes (``gateway.view_team`` … ``delete_team``).

This module imports no app (``catalog`` may use it: it imports neither ``fleet`` nor
``gateway``); the permission strings name them.
"""

from __future__ import annotations

from enum import StrEnum

from rest_framework import permissions


class Act(StrEnum):
    """Acts that need a permission of their own (see ``ACTS``)."""

    VIEW_CLUSTER = "view_cluster"
    STOP_CLUSTER = "stop_cluster"
    START_CLUSTER = "start_cluster"
    EXPLAIN_MODEL = "explain_model"
    WANT_MODEL = "want_model"
    EVICT_MODEL = "evict_model"
    CHANGE_ENGINE_CODE = "change_engine_code"
    REGISTER_AGENT = "register_agent"
    CORDON_AGENT = "cordon_agent"
    DRAIN_AGENT = "drain_agent"
    CREATE_KEY = "create_key"
    REVOKE_KEY = "revoke_key"
    REVOKE_API_TOKEN = "revoke_api_token"


#: Act → the Django permission (``app_label.codename``) it needs. Superusers have them all.
ACTS: dict[Act, str] = {
    Act.VIEW_CLUSTER: "catalog.view_clustersettings",  # GET /api/cluster/ (= llmgw status)
    Act.STOP_CLUSTER: "catalog.stop_cluster",
    Act.START_CLUSTER: "catalog.start_cluster",
    Act.EXPLAIN_MODEL: "catalog.view_model",  # GET /api/explain/NAME/
    Act.WANT_MODEL: "catalog.want_model",
    Act.EVICT_MODEL: "catalog.evict_model",
    # Profile command and env, pypi:/file: weights: code run on every agent (catalog.engine_code).
    Act.CHANGE_ENGINE_CODE: "catalog.change_engine_code",
    Act.REGISTER_AGENT: "fleet.add_agent",  # creates the agent and issues its token
    Act.CORDON_AGENT: "fleet.cordon_agent",  # cordon and uncordon
    Act.DRAIN_AGENT: "fleet.drain_agent",
    Act.CREATE_KEY: "gateway.add_apikey",  # issues a /v1/ key
    Act.REVOKE_KEY: "gateway.revoke_apikey",
    Act.REVOKE_API_TOKEN: "fleet.delete_apitoken",  # a REST API token, in the admin
}


def permission_for(act: Act | str) -> str:
    """The permission string ``act`` needs; KeyError for an act that is not in ``ACTS``."""
    return ACTS[Act(act)]


def can(user, act: Act | str) -> bool:
    """Whether ``user`` (a Django user, possibly anonymous) may do ``act``: active staff
    holding its permission (superusers hold every one)."""
    return bool(user and user.is_active and user.is_staff and user.has_perm(permission_for(act)))


def _is_staff(request) -> bool:
    user = getattr(request, "user", None)
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


class StaffModelPermissions(permissions.DjangoModelPermissions):
    """The REST API's default: active staff holding the model permission that matches the
    method (``view_`` for GET and HEAD, ``add_`` for POST, ``change_`` for PUT and PATCH,
    ``delete_`` for DELETE; OPTIONS only needs staff, like the schema).

    A viewset names its acts in ``act_permissions`` (``{"drain": Act.DRAIN_AGENT}``, keyed
    by the viewset action): those actions need the act's permission instead. A view without
    a queryset and without an act is refused (fail closed): give it :func:`requires`.
    """

    perms_map = {
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "OPTIONS": [],
        "HEAD": ["%(app_label)s.view_%(model_name)s"],
        "POST": ["%(app_label)s.add_%(model_name)s"],
        "PUT": ["%(app_label)s.change_%(model_name)s"],
        "PATCH": ["%(app_label)s.change_%(model_name)s"],
        "DELETE": ["%(app_label)s.delete_%(model_name)s"],
    }

    def has_permission(self, request, view) -> bool:
        if not _is_staff(request):
            return False
        act = getattr(view, "act_permissions", {}).get(getattr(view, "action", None))
        if act is not None:
            return request.method == "OPTIONS" or request.user.has_perm(permission_for(act))
        if getattr(view, "_ignore_model_permissions", False):
            return True
        queryset = getattr(view, "queryset", None)
        if queryset is None:
            if not hasattr(view, "get_queryset"):
                return False
            queryset = view.get_queryset()
        perms = self.get_required_permissions(request.method, queryset.model)
        return request.user.has_perms(perms)


def requires(act: Act | str) -> type[permissions.BasePermission]:
    """A DRF permission class for a view that does one act: active staff holding the act's
    permission (OPTIONS: staff only). Use with ``permission_classes = [requires(Act.X)]``."""
    perm = permission_for(act)

    class RequiresAct(permissions.BasePermission):
        message = f"You need the permission {perm} for this."

        def has_permission(self, request, view) -> bool:
            return _is_staff(request) and (request.method == "OPTIONS" or request.user.has_perm(perm))

    RequiresAct.__name__ = RequiresAct.__qualname__ = f"Requires_{Act(act).value}"
    RequiresAct.act = Act(act)
    RequiresAct.permission = perm
    return RequiresAct
