"""Django settings for llmgw.

Every value comes from an ``LLMGW_*`` environment variable with a safe default, so a bare
checkout runs the embedded mode (SQLite in WAL mode, django-q2's ORM broker, the in-memory
channel layer, one machine) with nothing to install. ``LLMGW_DATABASE_URL`` and
``LLMGW_REDIS_URL`` switch on production mode (PostgreSQL, Redis).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url

from llmgw import datadir
from llmgw.env import env_bool, env_duration_s, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
# Whatever llmgw writes (data directory, database, agent state, logs) is private to its user.
datadir.restrict_umask()
DATA_DIR = Path(env_str("DATA_DIR", str(BASE_DIR / "var"))).resolve()
_SQLITE_PATH = Path(env_str("SQLITE_PATH", str(DATA_DIR / "llmgw.sqlite3")))
#: What starting this process tightened (group/other bits removed); logged by ``llmgw.apps``.
DATA_DIR_TIGHTENED = datadir.prepare(DATA_DIR, tuple(
    _SQLITE_PATH.with_name(_SQLITE_PATH.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")))


#: ``LLMGW_SECRET_KEY`` (signs sessions and django-q2's tasks). Every control plane of a
#: cluster must share it: production mode (``LLMGW_DATABASE_URL``) refuses to start without
#: it (``llmgw.checks``, llmgw.E004). Embedded mode may leave it unset: a random key is then
#: kept in the data directory across restarts.
LLMGW_SECRET_KEY_SET = bool(env_str("SECRET_KEY", ""))


def _secret_key() -> str:
    """LLMGW_SECRET_KEY, else a random key kept in the data directory across restarts."""
    configured = env_str("SECRET_KEY", "")
    if configured:
        return configured
    path = DATA_DIR / "secret_key"
    if not path.exists():
        datadir.write_private(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
#: Host names always served: the machine itself (``llmgw up``'s own checks, a local agent).
LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]
#: ``LLMGW_ALLOWED_HOSTS``: the names clients use to reach this control plane, comma
#: separated (``*`` for any, behind a proxy that checks Host itself). Unset: loopback only;
#: ``llmgw up`` refuses a non-loopback ``--host`` without it.
LLMGW_ALLOWED_HOSTS = [h.strip() for h in env_str("ALLOWED_HOSTS", "").split(",") if h.strip()]
ALLOWED_HOSTS = LOOPBACK_HOSTS + [h for h in LLMGW_ALLOWED_HOSTS if h not in LOOPBACK_HOSTS]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]
#: ``LLMGW_BEHIND_TLS=1``: a TLS terminator in front sets ``X-Forwarded-Proto: https`` (and
#: strips any such header a client sent): cookies are then sent over HTTPS only, and Django
#: takes the request as secure when that header says so.
LLMGW_BEHIND_TLS = env_bool("BEHIND_TLS", False)
if LLMGW_BEHIND_TLS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served here: clusters are often offline
    "llmgw",
    "catalog",
    "fleet",
    "gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # 503 + Retry-After, not 500, while the database is away (PostgreSQL restarting).
    "llmgw.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "llmgw.urls"
ASGI_APPLICATION = "llmgw.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    # Persistent connections, checked before each request reuses one: a restarted
    # PostgreSQL leaves every process holding a dead connection otherwise.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(_SQLITE_PATH),
            "OPTIONS": {
                # Several processes (web, worker) write: WAL lets readers run beside the
                # writer, the timeout waits for the lock instead of failing at once, and
                # IMMEDIATE takes the write lock up front so two writers cannot deadlock.
                "timeout": env_int("SQLITE_BUSY_TIMEOUT_S", 20, minimum=1),
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", "") or None},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels and django-q2 ---------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
#: ``LLMGW_REDIS_PREFIX``: what keeps clusters sharing one Redis apart — the channel layer's
#: prefix, the cache's key prefix and the task queue's name (django-q2's ``name``) follow it.
REDIS_PREFIX = env_str("REDIS_PREFIX", "llmgw")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's layer with a poll shorter than redis-py's read timeout.
            "BACKEND": "llmgw.channel_layer.RedisChannelLayer",
            # The prefix keeps clusters (or test runs) sharing one Redis apart.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": REDIS_PREFIX},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

Q_CLUSTER = {
    "name": REDIS_PREFIX,  # the queue's name: clusters sharing a Redis never take each other's tasks
    "workers": env_int("Q_WORKERS", 2, minimum=1),
    # A pass takes well under a second; timeout < retry so a slow task is never run twice.
    "timeout": 60,
    "retry": 120,
    "max_attempts": 1,
    "catch_up": False,
    "ack_failures": True,
    "save_limit": 200,
    "poll": 0.1,
    "sync": env_bool("Q_SYNC", False),
    "label": "Reconciler tasks",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# --- Cache: counters shared by every web process (failed-login throttling) ----------------
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_PREFIX + ":cache",
        }
    }
else:
    # One process (the embedded default) or tests: in memory is enough.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "llmgw"}}

# --- Auth, i18n, static -------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
#: REST API tokens (POST /api/auth/token/) stop working this long after they were issued; 0: never.
LLMGW_API_TOKEN_TTL_S = env_duration_s("API_TOKEN_TTL", 30 * 86400.0)
#: Failed logins (token endpoint, HTTP basic) allowed per username and per client address
#: in each window; beyond it both answer 429 with Retry-After, even a correct password.
LLMGW_AUTH_FAILURE_LIMIT = env_int("AUTH_FAILURE_LIMIT", 5, minimum=1)
LLMGW_AUTH_FAILURE_WINDOW_S = env_duration_s("AUTH_FAILURE_WINDOW", 60.0)
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
#: The admin's instants read "2026-12-04 18:47:12 UTC" (llmgw/formats/), not "Dec. 4, 2026, 6:47 p.m.".
FORMAT_MODULE_PATH = ["llmgw.formats"]
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

REST_FRAMEWORK = {
    # Staff *and* the model permission (view/add/change/delete) or the act's permission
    # (llmgw.permissions: one permission per act for the admin, dashboard and API).
    "DEFAULT_PERMISSION_CLASSES": ["llmgw.permissions.StaffModelPermissions"],
    # The token class first: DRF answers a failed login with the first class's challenge,
    # and "Token" makes it a 401 (session auth has none: 403) without a browser's basic prompt.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.ops.api_auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "fleet.ops.api_auth.ThrottledBasicAuthentication",
    ],
    # Proxies in front that append to X-Forwarded-For: failed logins are then counted per
    # the address the last of them saw. 0 (the default): the socket's peer, never the header
    # (DRF's None would trust a client-written X-Forwarded-For and so dodge the throttle).
    "NUM_PROXIES": env_int("NUM_PROXIES", 0, minimum=0),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Missing or wrong credentials: always 401 with WWW-Authenticate, never DRF's 403.
    "EXCEPTION_HANDLER": "llmgw.rest.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw control plane API",
    "DESCRIPTION": "Catalog, fleet and cluster operations (staff only). The OpenAI-compatible gateway is /v1/.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAdminUser"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"gateway_answers": {"()": "llmgw.logfilters.SkipGatewayAnswers"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["gateway_answers"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "django-q": {"level": "WARNING"},
        # Who changed engine code (catalog.engine_code): kept whatever LLMGW_LOG_LEVEL says.
        "llmgw.audit": {"level": "INFO"},
    },
}

# --- llmgw behaviour: every period from the environment, so tests shrink them --------------
LLMGW_RECONCILE_INTERVAL_S = env_duration_s("RECONCILE_INTERVAL", 3.0)
LLMGW_WATCH_INTERVAL_S = env_duration_s("WATCH_INTERVAL", 0.2)
LLMGW_WATCH_FAST_INTERVAL_S = env_duration_s("WATCH_FAST_INTERVAL", 0.05)
#: How often the agents heartbeat (their ``--heartbeat-s`` / ``LLMGW_AGENT_HEARTBEAT_S``, 5 s
#: by default): the route grace must leave room for two (llmgw.W003).
LLMGW_HEARTBEAT_INTERVAL_S = env_duration_s("HEARTBEAT_INTERVAL", 5.0)
LLMGW_AGENT_LOST_AFTER_S = env_duration_s("AGENT_LOST_AFTER", 20.0)
#: The pass lock expires this long after its holder last extended it (a third of it, while
#: its pass runs): how long a worker killed mid-pass holds up the next pass.
LLMGW_PASS_LOCK_TTL_S = env_duration_s("PASS_LOCK_TTL", 10.0)
#: The leader lease (``fleet.control.leader``): the leading worker renews it every
#: ``LLMGW_LEADER_RENEW``; a standby takes it once it has not been renewed for
#: ``LLMGW_LEADER_LEASE``, so a dead leader is replaced within about lease + renew.
LLMGW_LEADER_LEASE_S = env_duration_s("LEADER_LEASE", 5.0)
LLMGW_LEADER_RENEW_S = env_duration_s("LEADER_RENEW", 1.0)
#: ``llmgw worker`` given SIGTERM (or SIGINT) gives up the lease at once, lets its tasks
#: finish for this long, then kills what is left of its task cluster and exits.
LLMGW_WORKER_STOP_GRACE_S = env_duration_s("WORKER_STOP_GRACE", 10.0)
LLMGW_USAGE_FLUSH_INTERVAL_S = env_duration_s("USAGE_FLUSH_INTERVAL", 1.0)
#: A web process served with the lifespan protocol (uvicorn: ``llmgw up``, ``llmgw web``)
#: writes its log lines from a thread (``llmgw.logqueue``), never from its event loop.
LLMGW_LOG_WRITER_THREAD = env_bool("LOG_WRITER_THREAD", True)
#: ``LLMGW_ADMISSION_ORDER``: ``fair`` (priority, then a weighted fair share across teams)
#: or ``fifo`` (arrival order: the baseline bench/tenants.py measures against).
LLMGW_ADMISSION_ORDER = env_str("ADMISSION_ORDER", "fair")
if LLMGW_ADMISSION_ORDER not in ("fair", "fifo"):
    raise ValueError(f"LLMGW_ADMISSION_ORDER must be fair or fifo, not {LLMGW_ADMISSION_ORDER!r}")
LLMGW_USAGE_REPORT_FRESH_S = env_duration_s("USAGE_REPORT_FRESH", 10.0)
LLMGW_DRAIN_GRACE_S = env_duration_s("DRAIN_GRACE", 30.0)
LLMGW_UPSTREAM_CONNECT_TIMEOUT_S = env_duration_s("UPSTREAM_CONNECT_TIMEOUT", 5.0)
LLMGW_UPSTREAM_READ_TIMEOUT_S = env_duration_s("UPSTREAM_READ_TIMEOUT", 600.0)
#: The largest answer the gateway reads from an engine or external service (decompressed),
#: and the largest single event of a stream: beyond it the answer is cut off (502, or an
#: error event), so that no upstream can fill the web process's memory.
LLMGW_MAX_UPSTREAM_BODY_BYTES = env_int("MAX_UPSTREAM_BODY_BYTES", 256 * 1024 * 1024, minimum=1024)
# --- bounds on what a client may send, enforced by llmgw.limits and llmgw.http ---
# (docs/architecture.md, "Gateway rules": body limits, connections are bounded before work)
#: The largest request body under /v1/, in bytes: 413 from Content-Length at once, or as
#: soon as a streamed (chunked) body passes it, before Django or authentication.
LLMGW_MAX_BODY_BYTES = env_int("MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1024)
#: The same for everything else (admin, REST API, dashboard): Django's own default.
LLMGW_MAX_ADMIN_BODY_BYTES = env_int("MAX_ADMIN_BODY_BYTES", 2_621_440, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(LLMGW_MAX_BODY_BYTES, LLMGW_MAX_ADMIN_BODY_BYTES)
#: A request body must have arrived whole this long after its head (else 408); 0: no limit.
LLMGW_BODY_TIMEOUT_S = env_duration_s("BODY_TIMEOUT", 30.0)
#: A request head (request line + headers) must be complete this long after its first byte,
#: or after the connection opened (else 408 and closed); 0: no limit. uvicorn (`llmgw up`).
LLMGW_HEADER_TIMEOUT_S = env_duration_s("HEADER_TIMEOUT", 10.0)
#: An idle keep-alive connection is closed after this long (uvicorn --timeout-keep-alive,
#: whole seconds). Behind a load balancer, make it longer than the balancer's idle timeout.
LLMGW_KEEP_ALIVE_TIMEOUT_S = env_duration_s("KEEP_ALIVE_TIMEOUT", 5.0)
#: Connections (HTTP, agents' websockets, held cold-start requests) per web process; beyond
#: it uvicorn answers 503 (uvicorn --limit-concurrency).
LLMGW_MAX_CONNECTIONS = env_int("MAX_CONNECTIONS", 1000, minimum=1)
#: Connections the kernel queues before the web process accepts them (uvicorn --backlog).
LLMGW_BACKLOG = env_int("BACKLOG", 2048, minimum=1)
LLMGW_BACKOFF_BASE_S = env_duration_s("BACKOFF_BASE", 5.0)
LLMGW_BACKOFF_CAP_S = env_duration_s("BACKOFF_CAP", 300.0)
#: A replica ready this long ends its model's crash loop (the backoff starts over).
LLMGW_BACKOFF_RESET_AFTER_S = env_duration_s("BACKOFF_RESET_AFTER", 60.0)
#: How long one process reuses the measured cold starts it read (they change only when a
#: replica first becomes ready; docs/architecture.md, R11). 0: read them every pass.
LLMGW_COLD_STARTS_CACHE_S = env_duration_s("COLD_STARTS_CACHE", 60.0)
LLMGW_AGENT_ROUTE_GRACE_S = env_duration_s("AGENT_ROUTE_GRACE", 12.0)
LLMGW_CONTROL_PLANE_HEARTBEAT_S = env_duration_s("CONTROL_PLANE_HEARTBEAT", 5.0)
LLMGW_LOAD_STALE_S = env_duration_s("LOAD_STALE", 15.0)
#: Least time between two stored readings (``fleet.models.GpuSample``) of one agent's GPUs,
#: the admin's GPU charts' resolution; the last reading on ``Gpu`` (``/metrics``) is always kept.
LLMGW_GPU_SAMPLE_EVERY_S = env_duration_s("GPU_SAMPLE_EVERY", 60.0)
LLMGW_DASHBOARD_REFRESH_S = env_duration_s("DASHBOARD_REFRESH", 5.0)
#: /readyz (``llmgw.health``): each check (database, channel layer, the watcher's first
#: refresh) is given this long, so a probe is answered within about it, never hangs.
LLMGW_READY_TIMEOUT_S = env_duration_s("READY_TIMEOUT", 1.5)
#: /readyz fails once this process's watcher (its routing table, keys and models) has not
#: refreshed for this long (it refreshes every ``LLMGW_WATCH_INTERVAL`` while the database answers).
LLMGW_READY_WATCH_STALE_S = env_duration_s("READY_WATCH_STALE", 10.0)
#: /v1/ requires an API key (``llmgw keys create``). Off only for trusted development setups.
LLMGW_GATEWAY_AUTH = env_bool("GATEWAY_AUTH", True)
#: ``LLMGW_METRICS_PUBLIC=1``: /metrics needs no token, even one ``llmgw up`` generated.
LLMGW_METRICS_PUBLIC = env_bool("METRICS_PUBLIC", False)
#: Where ``llmgw up`` keeps the metrics token it generates when exposed (mode 600).
LLMGW_METRICS_TOKEN_FILE = DATA_DIR / "metrics_token"
#: When set, /metrics asks for ``Authorization: Bearer <it>`` (Prometheus' ``authorization``):
#: ``LLMGW_METRICS_TOKEN``, else the token in ``LLMGW_METRICS_TOKEN_FILE`` if there is one.
LLMGW_METRICS_TOKEN = env_str("METRICS_TOKEN", "") or (
    "" if LLMGW_METRICS_PUBLIC or not LLMGW_METRICS_TOKEN_FILE.exists()
    else LLMGW_METRICS_TOKEN_FILE.read_text().strip())
LLMGW_PLACING_TIMEOUT_S = env_duration_s("PLACING_TIMEOUT", 120.0)
#: Largest message an agent may send over its websocket; larger ones get an error answer.
LLMGW_AGENT_MAX_MESSAGE_BYTES = env_int("AGENT_MAX_MESSAGE_BYTES", 1024 * 1024, minimum=64 * 1024)
#: How often a connected agent's token is re-checked (on its heartbeats): the bound on how
#: long a re-keyed or deleted agent keeps a websocket that no shared channel layer closed.
LLMGW_AGENT_TOKEN_RECHECK_S = env_duration_s("AGENT_TOKEN_RECHECK", 5.0)
#: Least time between two hellos on one agent connection (agents send one per connection):
#: each queues a reconcile pass, so a flood of them would keep the worker busy.
LLMGW_AGENT_HELLO_INTERVAL_S = env_duration_s("AGENT_HELLO_INTERVAL", 1.0)
