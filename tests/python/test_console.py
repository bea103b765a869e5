"""The approval console in a real headless Chromium, driven through WebDriver (selenium),
against the real gateway: sign in, a call arriving in the queue without a reload, approving
it and seeing the outcome; two browsers approving at once (one execution, one "already
decided"); a client link deciding its one call once; a forged and a cross-origin form refused;
another tenant's invocation not found. Screenshots go to target/console-screens/.

Chromium and chromedriver are the Debian packages `cargo xtask ci` installs; nothing is
downloaded (SE_OFFLINE, explicit driver path)."""

import http.server
import json
import os
import pathlib
import tempfile
import threading
import time

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import Gateway, bearer
from toolgate.v1 import toolgate_pb2 as pb

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENS = pathlib.Path(__file__).resolve().parents[2] / "target" / "console-screens"

EXPERT_POLICY = """
    @id("base") permit(principal, action, resource);
    @id("big-transfer") @decision("require_expert_approval") @risk("high")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"""

CLIENT_POLICY = """
    @id("base") permit(principal, action, resource);
    @id("ask-the-customer") @decision("require_client_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"""

TRANSFER = json.dumps({"amount": 5000, "region": "us-east-1", "account": "acct-7", "api_key": "k-secret-99"})


def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not pathlib.Path(path).exists():
            pytest.fail(f"{path} is missing: install the Debian packages chromium and chromium-driver (cargo xtask ci does)")
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1100,900"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def screenshot(driver, name):
    SCREENS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENS / f"{name}.png"))


def wait(driver, seconds=10):
    # An element read while a form's answer replaces the page (or the queue's refresh replaces
    # its rows) is stale: look again at the next poll. ChromeDriver does not always say so with
    # StaleElementReferenceException: a node replaced between finding it and reading its text
    # can come back as a bare WebDriverException ("unknown error: unhandled inspector error:
    # Node with given id does not belong to the document"), which is just as transient. A
    # condition that never holds still ends in a TimeoutException carrying the last error.
    return WebDriverWait(
        driver,
        seconds,
        poll_frequency=0.1,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException, WebDriverException),
    )


class Console:
    """A gateway with the console on, two tenants and their tokens."""

    def __init__(self):
        self.log = tempfile.NamedTemporaryFile(delete=False)
        self.gateway = Gateway(env={"TOOLGATE_CONSOLE_ENABLED": "true", "TESTKIT_EXECUTION_LOG": self.log.name})
        self.base = f"http://{self.gateway.address}"
        self.tokens = {}
        for tenant, policy in (("acme", EXPERT_POLICY), ("globex", EXPERT_POLICY), ("shop", CLIENT_POLICY)):
            self.tokens[tenant] = self.tenant(tenant, policy)

    def tenant(self, tenant, policy):
        admin, auth = self.gateway.admin, bearer(self.gateway.admin_token)
        admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant, name=tenant), metadata=auth)
        admin.CreateAgent(pb.CreateAgentRequest(tenant_id=tenant, agent_id="support"), metadata=auth)
        admin.SetPermission(pb.SetPermissionRequest(tenant_id=tenant, tool_name="testkit.transfer", enabled=True), metadata=auth)
        admin.SetFeatureFlag(pb.SetFeatureFlagRequest(tenant_id=tenant, flag="tool_calling_enabled", enabled=True), metadata=auth)
        admin.PutPolicy(pb.PutPolicyRequest(tenant_id=tenant, text=policy), metadata=auth)
        token = lambda role: admin.CreateToken(pb.CreateTokenRequest(role=role, tenant_id=tenant, label=f"{tenant}-{role}-browser"), metadata=auth).token
        return {"agent": token("agent"), "approver": token("approver")}

    def transfer(self, tenant):
        token = self.tokens[tenant]["agent"]
        run = self.gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"), metadata=bearer(token))
        result = self.gateway.agent.ExecuteTool(
            pb.ExecuteToolRequest(run_id=run.run_id, tool_name="testkit.transfer", arguments_json=TRANSFER), metadata=bearer(token)
        )
        assert result.status == pb.TOOL_CALL_STATUS_WAITING_APPROVAL, result
        return result

    def executions(self):
        return [line for line in pathlib.Path(self.log.name).read_text().splitlines() if line.strip()]

    def sign_in(self, driver, tenant):
        driver.get(f"{self.base}/console/sign-in")
        driver.find_element(By.ID, "token").send_keys(self.tokens[tenant]["approver"])
        driver.find_element(By.ID, "sign-in").click()
        wait(driver).until(lambda d: d.current_url.endswith("/console/queue"))

    def stop(self):
        self.gateway.stop()
        os.unlink(self.log.name)


@pytest.fixture(scope="module")
def console():
    c = Console()
    yield c
    c.stop()


@pytest.fixture
def two_browsers():
    first, second = browser(), browser()
    yield first, second
    first.quit()
    second.quit()


def test_a_call_arrives_in_the_queue_without_a_reload_and_is_approved(console, two_browsers):
    driver, _ = two_browsers
    console.sign_in(driver, "acme")
    assert "Nothing is waiting" in driver.find_element(By.ID, "queue").text
    # A marker on the window survives only if the page is never reloaded.
    driver.execute_script("window.__not_reloaded = true;")
    call = console.transfer("acme")
    row = f'tr[data-invocation="{call.pending_invocation_id}"]'
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert driver.execute_script("return window.__not_reloaded === true;"), "the queue was reloaded"
    # The queue's refresh replaces its rows: read the row inside a wait, which looks again.
    wait(driver).until(lambda d: "testkit.transfer" in d.find_element(By.CSS_SELECTOR, row).text)
    wait(driver).until(lambda d: "high" in d.find_element(By.CSS_SELECTOR, row).text)
    screenshot(driver, "queue")

    driver.find_element(By.CSS_SELECTOR, f"{row} a").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "arguments"))
    arguments = driver.find_element(By.ID, "arguments").text
    assert '"amount": 5000' in arguments and "acct-7" in arguments
    assert "k-secret-99" not in driver.page_source, "secrets are redacted"
    assert "big-transfer" in driver.find_element(By.ID, "policies").text
    screenshot(driver, "invocation")

    driver.find_element(By.ID, "approve").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "outcome"))
    assert "Approved: the call ran and ended succeeded" in driver.find_element(By.ID, "outcome").text
    assert driver.find_elements(By.ID, "output"), "the outcome's result is shown"
    screenshot(driver, "outcome")
    # The queue drops it without a reload either.
    driver.get(f"{console.base}/console/queue")
    driver.execute_script("window.__not_reloaded = true;")
    wait(driver).until(lambda d: not d.find_elements(By.CSS_SELECTOR, row))


def test_two_browsers_approving_at_once_execute_once(console, two_browsers):
    first, second = two_browsers
    console.sign_in(first, "acme")
    console.sign_in(second, "acme")
    before = len(console.executions())
    call = console.transfer("acme")
    page = f"{console.base}/console/invocations/{call.pending_invocation_id}"
    for driver in (first, second):
        driver.get(page)
        wait(driver).until(lambda d: d.find_elements(By.ID, "approve"))
    barrier = threading.Barrier(2)

    def approve(driver):
        barrier.wait()
        driver.find_element(By.ID, "approve").click()

    threads = [threading.Thread(target=approve, args=(d,)) for d in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers = []
    for driver in (first, second):
        wait(driver).until(lambda d: d.find_elements(By.ID, "outcome") or d.find_elements(By.ID, "already-decided"))
        answers.append("outcome" if driver.find_elements(By.ID, "outcome") else "already-decided")
    assert sorted(answers) == ["already-decided", "outcome"], answers
    loser = (first, second)[answers.index("already-decided")]
    assert "Already decided by acme-approver-browser" in loser.find_element(By.ID, "already-decided").text
    screenshot(loser, "already-decided")
    assert len(console.executions()) == before + 1, "exactly one execution"


def test_a_client_link_approves_its_call_once_then_refuses(console, two_browsers):
    driver, _ = two_browsers
    before = len(console.executions())
    call = console.transfer("shop")
    other = console.transfer("shop")
    assert call.client_approval_url.startswith("/console/link/")
    driver.get(console.base + call.client_approval_url)
    wait(driver).until(lambda d: d.find_elements(By.ID, "approve"))
    assert "testkit.transfer" in driver.find_element(By.ID, "tool").text
    assert not driver.find_elements(By.CSS_SELECTOR, 'form[action="/console/sign-out"]'), "nothing else"
    screenshot(driver, "client-link")
    driver.find_element(By.ID, "approve").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "outcome"))
    assert "Approved" in driver.find_element(By.ID, "outcome").text
    assert len(console.executions()) == before + 1
    driver.get(console.base + call.client_approval_url)
    assert "already used" in driver.find_element(By.ID, "link-state").text
    assert not driver.find_elements(By.ID, "approve")
    screenshot(driver, "client-link-used")
    # A forged repeat of the form (the POST replayed) is refused too, and the other call waits.
    driver.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "const i = document.createElement('input'); i.name = 'decision'; i.value = 'approve';"
        "f.appendChild(i); document.body.appendChild(f); f.submit();"
    )
    wait(driver).until(lambda d: d.find_elements(By.ID, "link-state"))
    assert "already used" in driver.find_element(By.ID, "link-state").text
    assert len(console.executions()) == before + 1
    driver.get(console.base + other.client_approval_url)
    assert driver.find_elements(By.ID, "approve"), "the other call's own link still works"


class EvilSite(http.server.BaseHTTPRequestHandler):
    """Another origin (another port), whose page posts a decision form to the gateway."""

    target = ""

    def do_GET(self):
        body = (
            f'<form id="f" method="post" action="{self.target}">'
            '<input name="decision" value="approve"><input name="version" value="1">'
            '<input name="csrf" value="guessed"></form>'
            '<script>document.getElementById("f").submit()</script>'
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_forged_and_cross_origin_forms_are_refused_and_another_tenant_is_not_found(console, two_browsers):
    driver, other = two_browsers
    console.sign_in(driver, "acme")
    call = console.transfer("acme")
    page = f"{console.base}/console/invocations/{call.pending_invocation_id}"
    before = len(console.executions())

    # The console's own page, its form stripped of the CSRF token.
    driver.get(page)
    driver.execute_script("document.querySelector('form.decide input[name=csrf]').remove();")
    driver.find_element(By.ID, "approve").click()
    wait(driver).until(lambda d: "Refused" in d.find_element(By.TAG_NAME, "h1").text)
    assert "form token" in driver.page_source
    screenshot(driver, "forged-refused")

    # A page of another origin posting to the console, with the session cookie in the browser.
    EvilSite.target = page
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EvilSite)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        driver.get(f"http://127.0.0.1:{evil.server_address[1]}/")
        wait(driver).until(lambda d: d.current_url.startswith(console.base))
        wait(driver).until(lambda d: "Refused" in d.find_element(By.TAG_NAME, "h1").text)
        assert "cross-origin" in driver.find_element(By.TAG_NAME, "h1").text
    finally:
        evil.shutdown()
    assert len(console.executions()) == before

    driver.get(page)
    assert driver.find_elements(By.ID, "approve"), "still pending"

    # Another tenant's approver: not found, not even its existence.
    console.sign_in(other, "globex")
    other.get(page)
    assert "Not found" in other.find_element(By.TAG_NAME, "h1").text
    assert "testkit.transfer" not in other.find_element(By.ID, "main").text


def test_an_admin_sets_up_a_tenant_in_the_browser(console, two_browsers):
    """The admin pages in a real browser: a tenant created from the form, a tool granted, the
    kill switch turned on through its confirmation, a policy refused with the error at its
    line, a token issued and shown once; every effect checked over gRPC."""
    driver, _ = two_browsers
    admin, auth = console.gateway.admin, bearer(console.gateway.admin_token)
    driver.get(f"{console.base}/console/sign-in")
    driver.find_element(By.ID, "token").send_keys(console.gateway.admin_token)
    driver.find_element(By.ID, "sign-in").click()
    wait(driver).until(lambda d: d.current_url.endswith("/console/admin"))

    driver.find_element(By.ID, "tenant_id").send_keys("initech")
    driver.find_element(By.ID, "tenant_name").send_keys("Initech")
    driver.find_element(By.ID, "create").click()
    wait(driver).until(lambda d: "Tenant initech created" in d.find_element(By.ID, "outcome").text)
    assert "initech" in [t.tenant_id for t in admin.ListTenants(pb.ListTenantsRequest(), metadata=auth).tenants]

    driver.find_element(By.ID, "agent_id").send_keys("support")
    driver.find_element(By.CSS_SELECTOR, "#create-agent button").click()
    wait(driver).until(lambda d: "Agent support created" in d.find_element(By.ID, "outcome").text)
    driver.find_element(By.CSS_SELECTOR, "#grant_tool option[value='testkit.transfer']").click()
    driver.find_element(By.ID, "grant").click()
    wait(driver).until(lambda d: "testkit.transfer granted to every agent" in d.find_element(By.ID, "outcome").text)
    screenshot(driver, "admin-tenant")

    driver.find_element(By.ID, "turn-on").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "confirm"))
    driver.find_element(By.ID, "confirm").send_keys("initech")
    screenshot(driver, "admin-kill-switch")
    driver.find_element(By.ID, "confirm-switch").click()
    wait(driver).until(lambda d: "Tool calling is on" in d.find_element(By.ID, "outcome").text)
    flag = admin.GetFeatureFlag(pb.GetFeatureFlagRequest(tenant_id="initech", flag="tool_calling_enabled"), metadata=auth)
    assert flag.enabled and flag.explicitly_set

    driver.get(f"{console.base}/console/admin/tenants/initech/policy")
    text = driver.find_element(By.ID, "policy-text")
    text.clear()
    text.send_keys('@id("base") permit(principal, action, resource);\n@id("typo") permit(principal, action == Toolgate::Action::"testkit.nope", resource);\n')
    driver.find_element(By.ID, "save").click()
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#line-2.error-line"))
    assert "nothing was stored" in driver.find_element(By.ID, "form-problem").text
    screenshot(driver, "admin-policy-error")
    assert admin.GetPolicy(pb.GetPolicyRequest(tenant_id="initech"), metadata=auth).version == 0

    driver.get(f"{console.base}/console/admin/tokens")
    driver.find_element(By.CSS_SELECTOR, "#token-role option[value='agent']").click()
    driver.find_element(By.CSS_SELECTOR, "#token-tenant option[value='initech']").click()
    driver.find_element(By.ID, "token-label").send_keys("initech-bot")
    driver.find_element(By.ID, "issue").click()
    wait(driver).until(lambda d: d.find_elements(By.ID, "new-token"))
    token = driver.find_element(By.ID, "new-token").text
    screenshot(driver, "admin-token")
    run = console.gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"), metadata=bearer(token))
    result = console.gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(run_id=run.run_id, tool_name="testkit.transfer", arguments_json=json.dumps({"amount": 5, "region": "us-east-1", "account": "a"})),
        metadata=bearer(token),
    )
    assert result.status == pb.TOOL_CALL_STATUS_SUCCEEDED, result
    driver.get(f"{console.base}/console/admin/tokens")
    assert token not in driver.page_source, "a token is shown once only"
