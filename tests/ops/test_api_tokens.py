"""REST API tokens and password logins, tried as an attacker would: an expired token is
refused (401, saying so); guessing passwords at the token endpoint or with HTTP basic is
throttled per username and per client address (429 with Retry-After, a correct password
included, until the window ends; a success does not count; a forged X-Forwarded-For does
not dodge it); the admin lists tokens and deleting one stops it at once; password
validators are on and ``llmgw up`` says clearly when an operator's password fails them."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from llmgw import auth_throttle
from fleet.models import ApiToken

pytestmark = pytest.mark.django_db


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def ops(django_user_model):
    """A staff member who may read the cluster's status (so a 200 proves the login)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("ops", password="right-horse-battery", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_clustersettings"))
    return user


def get_token(password: str = "right-horse-battery", username: str = "ops", **extra):
    return APIClient(**extra).post("/api/auth/token/", {"username": username, "password": password}, format="json")


def with_token(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def clock(monkeypatch):
    """The throttle's clock, moved by hand (the cache's own expiry is only a bound)."""
    now = [1_000_000.0 * 60]

    monkeypatch.setattr(auth_throttle, "_now", lambda: now[0])
    return now


# --- Expiry ------------------------------------------------------------------------------------


def test_a_token_works_until_it_expires_then_answers_401_saying_so(ops, settings):
    settings.LLMGW_API_TOKEN_TTL_S = 3600
    token = get_token().json()["token"]
    assert with_token(token).get("/api/cluster/").status_code == 200
    row = ApiToken.objects.get()
    assert row.last_used_at is not None and row.expires_at == row.created_at + timedelta(hours=1)
    ApiToken.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(hours=1, seconds=1))
    answer = with_token(token).get("/api/cluster/")
    assert answer.status_code == 401
    assert "Token expired" in answer.json()["detail"] and "POST /api/auth/token/" in answer.json()["detail"]
    assert answer["WWW-Authenticate"] == "Token"
    # Lengthening the TTL applies to tokens already issued (the expiry is computed on use).
    settings.LLMGW_API_TOKEN_TTL_S = 7200
    assert with_token(token).get("/api/cluster/").status_code == 200


def test_the_default_ttl_is_thirty_days_and_zero_means_never(ops, settings):
    from django.conf import settings as conf

    assert conf.LLMGW_API_TOKEN_TTL_S == 30 * 86400
    token = get_token().json()["token"]
    ApiToken.objects.update(created_at=timezone.now() - timedelta(days=31))
    assert with_token(token).get("/api/cluster/").status_code == 401
    settings.LLMGW_API_TOKEN_TTL_S = 0
    assert with_token(token).get("/api/cluster/").status_code == 200
    assert ApiToken.objects.get().expires_at is None


def test_last_use_is_written_at_most_once_a_minute(ops):
    token = get_token().json()["token"]
    with_token(token).get("/api/cluster/")
    first = ApiToken.objects.get().last_used_at
    with_token(token).get("/api/cluster/")
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=first - timedelta(minutes=2))
    with_token(token).get("/api/cluster/")
    assert ApiToken.objects.get().last_used_at > first


# --- Throttling the token endpoint --------------------------------------------------------------


def test_the_sixth_failed_token_request_in_a_window_is_429_and_then_even_the_right_password(ops, clock):
    for _ in range(5):
        assert get_token("guess").status_code == 401
    answer = get_token("guess")
    assert answer.status_code == 429
    assert int(answer["Retry-After"]) >= 1 and "Too many failed logins" in answer.json()["detail"]
    refused = get_token()  # the right password, still inside the window
    assert refused.status_code == 429 and "token" not in refused.json()
    assert not ApiToken.objects.exists()
    clock[0] += 61  # the window has passed
    assert get_token().status_code == 200
    assert ApiToken.objects.count() == 1


def test_retry_after_says_when_the_window_ends(ops, clock):
    clock[0] += 15  # 15 s into a window of 60
    for _ in range(5):
        get_token("guess")
    assert get_token("guess")["Retry-After"] == "45"


def test_failures_count_per_username_across_addresses(ops, clock):
    for n in range(5):
        assert get_token("guess", REMOTE_ADDR=f"10.0.0.{n + 1}").status_code == 401
    assert get_token(REMOTE_ADDR="10.0.9.9").status_code == 429
    # Another user from yet another address is not affected.
    ops.__class__.objects.create_user("other", password="another-long-secret", is_staff=True)
    assert get_token("another-long-secret", username="other", REMOTE_ADDR="10.0.9.8").status_code == 200


def test_failures_count_per_address_across_usernames_and_a_forged_forwarded_for_changes_nothing(ops, clock):
    for n in range(5):
        answer = get_token("guess", username=f"user{n}", REMOTE_ADDR="203.0.113.7",
                           HTTP_X_FORWARDED_FOR=f"198.51.100.{n}")
        assert answer.status_code == 401
    assert get_token(REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="192.0.2.1").status_code == 429
    assert get_token(REMOTE_ADDR="203.0.113.8").status_code == 200  # ops itself had no failure


def test_a_success_does_not_count_nor_reset_the_failures(ops, clock):
    for _ in range(4):
        get_token("guess")
    assert get_token().status_code == 200
    assert get_token("guess").status_code == 401  # the fifth failure
    assert get_token().status_code == 429


def test_usernames_are_counted_whatever_their_case(ops, clock):
    for n in range(5):
        get_token("guess", username="OPS" if n % 2 else "ops", REMOTE_ADDR=f"10.1.0.{n}")
    assert get_token(REMOTE_ADDR="10.1.1.1").status_code == 429


@pytest.mark.parametrize("how", ["token", "basic"])
def test_guesses_in_flight_at_once_count_before_their_passwords_are_checked(ops, clock, monkeypatch, how):
    """Checking the count, then checking the password, then counting the failure would let
    every guess sent at once (each one waiting on the slow password hash) through the
    check: a burst of 12 would be 12 guesses. At most the limit reach a password check."""
    import threading
    import time

    from django.contrib.auth.backends import ModelBackend

    entered, release = [], threading.Event()

    def slow_wrong_password(self, request, username=None, password=None, **kwargs):
        entered.append(username)
        release.wait(5)
        return None  # a wrong password

    monkeypatch.setattr(ModelBackend, "authenticate", slow_wrong_password)
    answers = []

    def guess(n):
        if how == "token":
            answers.append(get_token(f"guess{n}", REMOTE_ADDR="192.0.2.50").status_code)
        else:
            client = APIClient(REMOTE_ADDR="192.0.2.50")
            client.credentials(HTTP_AUTHORIZATION=basic("ops", f"guess{n}"))
            answers.append(client.get("/api/cluster/").status_code)

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while len(entered) + len(answers) < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    # The claim is a bound: never more than the limit. Fewer may get through when guesses
    # race (a refused one holds its count until it takes it back), never none.
    assert 0 < len(entered) <= 5, f"{len(entered)} guesses reached the password check"
    refused = 401  # a wrong password, either way
    assert sorted(answers) == [refused] * len(entered) + [429] * (12 - len(entered)), answers


def test_a_number_for_a_username_is_counted_as_that_username(django_user_model, clock):
    """The serializer takes a JSON number as a username: it must not dodge the per-user count."""
    django_user_model.objects.create_user("12345", password="right-horse-battery", is_staff=True)
    for n in range(5):
        answer = APIClient().post("/api/auth/token/", {"username": 12345, "password": "guess"}, format="json",
                                  REMOTE_ADDR=f"10.2.0.{n}")
        assert answer.status_code == 401
    for username in (12345, "12345"):
        answer = APIClient().post("/api/auth/token/", {"username": username, "password": "right-horse-battery"},
                                  format="json", REMOTE_ADDR="10.2.1.1")
        assert answer.status_code == 429
    assert not ApiToken.objects.exists()


def test_an_ipv6_client_is_counted_by_its_slash_64(ops, clock):
    """One host holds a whole /64: changing the last bits at every attempt is one address."""
    for n in range(5):
        assert get_token("guess", username=f"user{n}", REMOTE_ADDR=f"2001:db8:1:2::{n + 1:x}").status_code == 401
    assert get_token(REMOTE_ADDR="2001:db8:1:2:ffff::9").status_code == 429
    assert get_token(REMOTE_ADDR="2001:db8:1:3::1").status_code == 200  # another /64


def test_an_ipv4_mapped_ipv6_address_is_the_ipv4_address(ops, clock):
    for n in range(5):
        address = "::ffff:198.51.100.4" if n % 2 else "198.51.100.4"
        assert get_token("guess", username=f"user{n}", REMOTE_ADDR=address).status_code == 401
    assert get_token(REMOTE_ADDR="198.51.100.4").status_code == 429
    assert get_token(REMOTE_ADDR="::ffff:198.51.100.4").status_code == 429


def test_a_malformed_token_request_is_a_400_not_a_500(clock):
    assert APIClient().post("/api/auth/token/", [1, 2], format="json").status_code == 400
    assert APIClient().post("/api/auth/token/", {"username": ["x"], "password": 5}, format="json").status_code == 400


# --- Throttling HTTP basic ------------------------------------------------------------------------


def test_basic_auth_failures_are_throttled_too_and_share_the_counters(ops, clock):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "guess"))
    for _ in range(5):
        assert client.get("/api/cluster/").status_code == 401
    assert client.get("/api/cluster/").status_code == 429
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "right-horse-battery"))
    answer = client.get("/api/cluster/")
    assert answer.status_code == 429 and int(answer["Retry-After"]) >= 1
    assert get_token().status_code == 429  # the token endpoint sees the same failures
    clock[0] += 61
    assert client.get("/api/cluster/").status_code == 200


def test_a_throttled_basic_login_changes_nothing(ops, clock):
    from catalog.models import ClusterSettings
    from django.contrib.auth.models import Permission

    ops.user_permissions.add(Permission.objects.get(codename="stop_cluster"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "guess"))
    for _ in range(5):
        client.post("/api/cluster/stop/")
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "right-horse-battery"))
    assert client.post("/api/cluster/stop/").status_code == 429
    assert not ClusterSettings.get_solo().stopped


# --- Throttling the admin's login page ----------------------------------------------------------


def admin_login(username: str, password: str, **extra):
    from django.test import Client

    client = Client(**extra)
    answer = client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"})
    return answer, "_auth_user_id" in client.session


def test_the_admin_login_page_is_throttled_with_the_api_counters(ops, clock):
    """Otherwise guessing would go on at /admin/login/ while the API answers 429."""
    answer, logged_in = admin_login("ops", "right-horse-battery")
    assert answer.status_code == 302 and logged_in
    for _ in range(5):
        answer, logged_in = admin_login("ops", "guess")
        assert answer.status_code == 200 and not logged_in
    answer, logged_in = admin_login("ops", "right-horse-battery", REMOTE_ADDR="10.3.0.1")
    assert not logged_in and "Too many failed logins" in answer.content.decode()
    assert get_token(REMOTE_ADDR="10.3.0.2").status_code == 429  # the same counters
    clock[0] += 61
    assert admin_login("ops", "right-horse-battery")[1]


def test_api_failures_throttle_the_admin_login_and_its_username_is_normalised(ops, clock):
    """The admin's form reads a username as NFKC (fullwidth letters log in as ops): counted as ops."""
    for n in range(5):
        assert get_token("guess", REMOTE_ADDR=f"10.4.0.{n}").status_code == 401
    for username in ("ops", " OPS ", "\uff4f\uff50\uff53"):
        answer, logged_in = admin_login(username, "right-horse-battery", REMOTE_ADDR="10.4.1.1")
        assert not logged_in, username


# --- The admin's list of tokens ---------------------------------------------------------------------


def test_the_admin_lists_tokens_and_deleting_one_stops_it_at_once(ops, admin_client):
    token = get_token().json()["token"]
    assert with_token(token).get("/api/cluster/").status_code == 200
    row = ApiToken.objects.get()
    page = admin_client.get("/admin/fleet/apitoken/").content.decode()
    assert row.prefix in page and "ops" in page and token not in page
    assert "column-last_used_at" in page and "Last used at" in page
    assert row.last_used_at is not None  # the call above used it
    assert admin_client.get("/admin/fleet/apitoken/add/").status_code == 403
    answer = admin_client.post("/admin/fleet/apitoken/", {"action": "delete_selected", "_selected_action": [row.pk],
                                                          "post": "yes"})
    assert answer.status_code == 302
    assert not ApiToken.objects.exists()
    answer = with_token(token).get("/api/cluster/")
    assert answer.status_code == 401


def test_revoking_tokens_in_the_admin_needs_its_permission(ops, client, django_user_model):
    from django.contrib.auth.models import Permission

    get_token()
    row = ApiToken.objects.get()
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    client.login(username="viewer", password="pw")
    assert row.prefix in client.get("/admin/fleet/apitoken/").content.decode()
    client.post("/admin/fleet/apitoken/", {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    assert client.post(f"/admin/fleet/apitoken/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ApiToken.objects.filter(pk=row.pk).exists()


# --- Password validators -------------------------------------------------------------------------------


def test_password_validators_are_on(django_user_model):
    user = django_user_model(username="alice")
    for weak in ("pw", "password123", "12345678901", "alice1"):
        with pytest.raises(ValidationError):
            validate_password(weak, user)
    validate_password("correct horse battery staple 9", user)


def test_up_refuses_an_operator_password_that_fails_the_validators_clearly(monkeypatch, tmp_path, settings):
    from django.contrib.auth import get_user_model

    from llmgw.cli.up import ensure_admin

    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("LLMGW_ADMIN_PASSWORD", "admin")
    with pytest.raises(CommandError) as refused:
        ensure_admin(None)
    assert "LLMGW_ADMIN_PASSWORD is not accepted" in str(refused.value) and "too short" in str(refused.value)
    assert not get_user_model().objects.filter(username="admin").exists()
    assert not (tmp_path / "admin_password").exists()


def test_up_generates_a_password_the_validators_accept(monkeypatch, tmp_path, settings):
    from django.contrib.auth import get_user_model

    from llmgw.cli.up import ensure_admin

    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("LLMGW_ADMIN_PASSWORD", raising=False)
    _, password = ensure_admin(None)
    user = get_user_model().objects.get(username="admin")
    validate_password(password, user)
    assert user.check_password(password)


def test_the_ttl_setting_takes_days():
    from llmgw.env import parse_duration_s

    assert parse_duration_s("30d") == 30 * 86400 and parse_duration_s("12h") == 43200


def test_a_new_password_ends_the_users_tokens_as_it_ends_their_sessions(ops, admin_client, django_user_model):
    """A token taken with a stolen password kept working after the owner changed it."""
    token = get_token().json()["token"]
    other = django_user_model.objects.create_user("other", password="another-long-secret", is_staff=True)
    other_token = ApiToken.issue(other)
    assert with_token(token).get("/api/cluster/").status_code == 200
    ops.set_password("a-brand-new-long-secret")
    ops.save()
    assert with_token(token).get("/api/cluster/").status_code == 401
    assert not ApiToken.objects.filter(user=ops).exists()
    assert ApiToken.objects.filter(user=other).count() == 1  # someone else's stay
    # Through the admin's password form too.
    answer = admin_client.post(f"/admin/auth/user/{other.pk}/password/",
                               {"password1": "yet-another-long-secret", "password2": "yet-another-long-secret"})
    assert answer.status_code == 302
    assert with_token(other_token).get("/api/cluster/").status_code == 401
    # Saving a user without a new password (a rename, a login) keeps their tokens.
    token = get_token("a-brand-new-long-secret").json()["token"]
    ops.first_name = "Ops"
    ops.save()
    assert with_token(token).get("/api/cluster/").status_code == 200
