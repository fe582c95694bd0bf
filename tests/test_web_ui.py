"""The Temporal Web UI, driven in headless Chromium (Debian's, through Playwright), shows a session made through the
Managed Agents API the way an operator needs it: its summary (title and model) and static details (metadata), its
current details (the status line the workflow keeps) and its search attributes (status, workspace). Screenshots
are kept under test-artifacts/web-ui/ at the repo root.

The shared dev server runs headless, so this module starts its own with the Web UI on (it overrides
`temporal_env`, which `stack` uses). No Chromium, or no Web UI, is a failure that says so, never a skip."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, FrameLocator, Page, async_playwright, expect
from playwright.async_api import Error as PlaywrightError
from temporalio.testing import WorkflowEnvironment

from corral.temporal import start_local_temporal
from gateway.owned import WORKSPACE_KEY
from tests.browser import CHROMIUM_ARGS, ChromiumUnavailable, ensure_chromium
from tests.conftest import Stack
from tests.ports import free_port
from tests.test_gateway import Gateway, agent_and_environment, running_gateway, until_idle

pytestmark = pytest.mark.timeout(300)

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "web-ui"
SHOWN_WITHIN_MS = 60_000
"""How long the UI may take to fetch and render what is asserted (it loads data after the page loads)."""


@pytest.fixture(scope="module")
def ui_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
async def temporal_env(ui_port: int) -> AsyncIterator[WorkflowEnvironment]:
    """This module's dev server, with its Web UI on `ui_port`: `stack` (and so the gateway) uses it here."""
    env = await start_local_temporal(port=free_port(), ui=True, ui_port=ui_port, dev_server_log_level="error")
    yield env
    await env.shutdown()


@pytest.fixture(scope="module")
async def web_ui(temporal_env: WorkflowEnvironment, ui_port: int) -> str:
    """The Web UI's base URL, once it answers; a clear failure if it never does."""
    url = f"http://127.0.0.1:{ui_port}"
    last = "no answer"
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(300):
            try:
                answer = await http.get(url)
                if answer.status_code == 200:
                    return url
                last = f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)
    pytest.fail(f"the Temporal Web UI of the dev server did not answer at {url}: {last}", pytrace=False)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium (installed with apt when absent), headless, through Playwright; never a downloaded one."""
    try:
        executable = await asyncio.to_thread(ensure_chromium)
    except ChromiumUnavailable as exc:
        pytest.fail(f"the Web UI test needs Chromium: {exc}", pytrace=False)
    async with async_playwright() as playwright:
        try:
            chromium = await playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        except PlaywrightError as exc:
            pytest.fail(f"{executable} did not start headless under Playwright: {exc}", pytrace=False)
        yield chromium
        await chromium.close()


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    """As tests/test_gateway.py's: a real gateway process on this module's stack."""
    async with running_gateway(stack, tmp_path) as running:
        yield running


@pytest.fixture
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A fresh page; what it shows at the end of the test is kept as `<test>.png`, passed or failed."""
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    try:
        yield page
        await keep_screenshot(page, request.node.name)
    finally:
        await context.close()


async def test_the_web_ui_shows_a_sessions_summary_status_and_search_attributes(
    stack: Stack, gateway: Gateway, web_ui: str, page: Page, request: pytest.FixtureRequest
) -> None:
    client = await gateway.client("team-web-ui")
    model = stack.script([{"text": "hello from the model"}])
    agent, environment = await agent_and_environment(client, model)
    session = await client.beta.sessions.create(
        agent=agent.id, environment_id=environment.id, title="Web UI check", metadata={"ticket": "WEB-13"}
    )
    seen: list[Any] = []
    async with await client.beta.sessions.events.stream(session.id) as stream:
        listening = asyncio.create_task(until_idle(stream, seen))  # open: it holds what is written from now
        await client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
        )
        await asyncio.wait_for(listening, 60)
    assert "agent.message" in [e.type for e in seen]
    # The workspace as Temporal holds it (the gateway fixture makes each test's workspace name its own).
    described = await stack.client.get_workflow_handle(session.id).describe()
    workspace = described.typed_search_attributes.get(WORKSPACE_KEY)
    assert workspace is not None and workspace.startswith("team-web-ui"), workspace

    await page.goto(f"{web_ui}/namespaces/default/workflows/{session.id}")
    await expect(page.get_by_role("heading", name=session.id)).to_be_visible(timeout=SHOWN_WITHIN_MS)

    await page.get_by_role("tab", name="User Metadata").click()
    # The static summary (title and model) and details (the session's metadata), set at start.
    summary, details = rendered(page, "Summary"), rendered(page, "Details")
    await expect(summary.get_by_text(f"Web UI check · {model}")).to_be_visible(timeout=SHOWN_WITHIN_MS)
    await expect(details.locator("p", has=details.locator("strong", has_text="ticket"))).to_have_text(
        "ticket WEB-13", timeout=SHOWN_WITHIN_MS
    )
    # The current details: the status line the workflow keeps, with the status in bold.
    current = rendered(page, "Current Details")
    await expect(current.locator("strong").first).to_have_text("idle", timeout=SHOWN_WITHIN_MS)
    await expect(current.get_by_text(re.compile(r"\(end_turn\) · model"))).to_be_visible(timeout=SHOWN_WITHIN_MS)
    await keep_screenshot(page, f"{request.node.name}-user-metadata")

    await page.get_by_role("tab", name="Search Attributes").click()
    # Shown as JSON, one attribute a line.
    for name, value in [("CorralStatus", "idle"), ("CorralWorkspace", workspace), ("CorralModel", model)]:
        line = page.get_by_text(re.compile(rf'^\s*"{name}":\s*"{re.escape(value)}",?\s*$'))
        await expect(line).to_be_visible(timeout=SHOWN_WITHIN_MS)


def rendered(page: Page, heading: str) -> FrameLocator:
    """The markdown the UI renders (in a sandboxed iframe) under one heading of the User Metadata tab."""
    return page.get_by_role("heading", name=heading, exact=True).locator("xpath=following::iframe[1]").content_frame


async def keep_screenshot(page: Page, name: str) -> Path:
    """The whole page as test-artifacts/web-ui/<name>.png; its path is printed (`pytest -s` shows it)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=shot, full_page=True)
    print(f"\nWeb UI screenshot: {shot}")
    return shot
