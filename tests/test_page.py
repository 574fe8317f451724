"""The chat page at ``/`` and the ``edgespec`` field of streamed chunks.

Three layers: the field's bookkeeping on hand-made chunks (milliseconds); the page's routes and key rules on an
app with no model; then a real ``edgespec serve`` on 127.0.0.1 (SmolLM2 drafting for itself, with an API key)
driven by the official openai client and by headless Chromium through Selenium (Debian's ``chromium`` and
``chromium-driver``; ``make browser`` installs them, and these tests fail rather than skip without them).

Screenshots go to ``$EDGESPEC_SHOTS`` (else a pytest temporary directory) and are copied to /tmp/edgespec-shots.
Every wait is bounded (:func:`wait_until`).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from test_server import WAIT, LiveServer, tiny_loader, wait_until

from edgespec.events import Chunk, Span, Stats
from edgespec.server import ServerSettings, create_app
from edgespec.server.extension import RoundLog

KEY = "page-test-key"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS_COPY = Path("/tmp/edgespec-shots")
PROMPT = "Write a Python function that adds two numbers."
TTFT_TRIALS = 9


# ----- the extension field, on hand-made chunks ---------------------------------------------------------------
def chunk(spans: list[tuple[str, bool]], **stats) -> Chunk:
    return Chunk(
        "".join(t for t, _ in spans), (), tuple(d for _, d in spans), tuple(Span(t, d) for t, d in spans),
        Stats(**stats),
    )


def test_round_log_names_origins_by_the_rounds_drafter():
    log = RoundLog()
    first = chunk([("def", True), (" add", True), ("(", False)], rounds=1, drafted=2, accepted=2, drafter="model",
                  draft_len=2, generated=3, t_total=0.5)
    log.observe(first)
    frame = log.frame(first)
    assert frame["spans"] == [{"text": "def add", "origin": "draft"}, {"text": "(", "origin": "target"}]
    assert frame["rounds"] == [{"drafter": "model", "drafted": 2, "accepted": 2, "t": 0.5}]
    assert frame["live"]["drafter"] == "model" and frame["live"]["draft_len"] == 2

    second = chunk([("a, b", True), (")", False)], rounds=2, drafted=5, accepted=3, drafter="lookup", draft_len=3,
                   generated=5, t_total=0.7)
    log.observe(second)
    frame = log.frame(second)
    assert [s["origin"] for s in frame["spans"]] == ["lookup", "target"]
    assert "".join(s["text"] for s in frame["spans"]) == second.text
    assert frame["rounds"] == [{"drafter": "lookup", "drafted": 3, "accepted": 1, "t": 0.7}]
    assert frame["live"]["acceptance_rate"] == 0.6

    third = chunk([("return", True), (" a", False)], rounds=3, drafted=6, accepted=4, drafter="cache", draft_len=1,
                  generated=7, t_total=0.8)
    log.observe(third)
    assert [s["origin"] for s in log.frame(third)["spans"]] == ["cache", "target"]  # copied from an earlier reply


def test_round_log_keeps_rounds_of_chunks_with_no_text_and_ignores_a_tail():
    log = RoundLog()
    log.observe(chunk([], rounds=1, drafted=2, accepted=0, drafter="model"))  # text held back (UTF-8, stop prefix)
    shown = chunk([("é", False)], rounds=2, drafted=2, accepted=0, drafter="none")
    log.observe(shown)
    assert [r["drafted"] for r in log.frame(shown)["rounds"]] == [2, 0]
    tail = chunk([("!", False)], rounds=2, drafted=2, accepted=0, drafter="none")  # the text stream's tail
    log.observe(tail)
    assert log.frame(tail)["rounds"] == []
    end = log.finish(Stats(rounds=2, drafted=2, generated=2, t_verify=0.1, plain_tokens_per_second=10.0))
    assert end["spans"] == [] and end["rounds"] == []
    assert end["summary"] == {"speedup": 2.0, "plain_tokens_per_second": 10.0, "busy_seconds": 0.1}


# ----- routes and key rules, no model -------------------------------------------------------------------------
def no_model():
    raise RuntimeError("no model in this test")


@pytest.mark.parametrize("api_key", [None, KEY])
def test_page_is_public_and_says_whether_a_key_is_needed(api_key):
    with TestClient(create_app(no_model, ServerSettings(api_key=api_key))) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        wanted = "required" if api_key else "none"
        assert f'<meta name="edgespec-key" content="{wanted}">' in page.text
        assets = [("app.js", "text/javascript"), ("markdown.js", "text/javascript"), ("style.css", "text/css")]
        for name, kind in assets:
            asset = http.get(f"/static/{name}")
            assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind), name
        assert http.get("/static/..%2Fpage.py").status_code == 404  # only the files read at start, by name
        assert http.get("/static/nothing.js").status_code == 404
        models = http.get("/v1/models")
        assert models.status_code == (401 if api_key else 503)  # the API keeps its rules (and no model loaded)


def test_static_files_ship_with_the_package():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    root = Path(__file__).parent.parent
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["edgespec"]
    assert "server/static/*" in data
    static = root / "edgespec" / "server" / "static"
    for path in static.iterdir():  # nothing fetched at run time: no http(s) URL in any file the page loads
        text = path.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, path.name


# ----- a real server -------------------------------------------------------------------------------------------
class TimedServer(LiveServer):
    """A :class:`LiveServer` that times each chat completion on the server: from the app's call to the first frame
    with text handed to uvicorn, in ms (:attr:`first_content`, in the order the responses end)."""

    def __init__(self, load, settings: ServerSettings) -> None:
        super().__init__(load, settings)
        self.first_content: list[float] = []
        self.server = uvicorn.Server(uvicorn.Config(
            self.timed, host="127.0.0.1", port=0, log_level="warning", interface="asgi3"
        ))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def timed(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        arrival, first = time.perf_counter(), None

        async def timed_send(message) -> None:
            nonlocal first
            if first is None and message["type"] == "http.response.body" and b'"content"' in message.get("body", b""):
                first = time.perf_counter()
            await send(message)

        await self.app(scope, receive, timed_send)
        if first is not None:
            self.first_content.append((first - arrival) * 1000)


@pytest.fixture(scope="module")
def live(tiny_model_path: Path):
    server = TimedServer(tiny_loader(tiny_model_path), ServerSettings(alias="tiny", api_key=KEY)).start()
    yield server
    server.stop()


def api_client(live: LiveServer):
    return live.client(api_key=KEY)


def metric(live: LiveServer, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(live.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.real
def test_openai_client_parses_chunks_with_the_extension(live: LiveServer):
    live.wait_idle()
    client = api_client(live)
    messages = [{"role": "user", "content": PROMPT}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    exts = [c.model_extra["edgespec"] for c in chunks]
    assert "".join(s["text"] for e in exts for s in e["spans"]) == text
    assert {s["origin"] for e in exts for s in e["spans"]} <= {"draft", "lookup", "cache", "target"}
    assert any(s["origin"] == "draft" for e in exts for s in e["spans"])  # the tiny model agrees with itself
    rounds = [r for e in exts for r in e["rounds"]]
    last = chunks[-1].model_extra
    assert len(rounds) == last["speculation"]["rounds"]
    assert sum(r["drafted"] for r in rounds) == last["speculation"]["drafted"]
    assert sum(r["accepted"] for r in rounds) == last["speculation"]["accepted"]
    assert "speedup" in last["edgespec"]["summary"]

    live.wait_idle()  # with include_usage the usage chunk (no choices) finishes, the extension with it
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert "summary" in chunks[-1].model_extra["edgespec"]

    live.wait_idle()
    pieces = list(client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8, temperature=0,
                                            stream=True))
    assert "".join(p.choices[0].text for p in pieces) == "".join(
        s["text"] for p in pieces for s in p.model_extra["edgespec"]["spans"]
    )


# ----- the page in headless Chromium ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("EDGESPEC_SHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_shot(driver, shots: Path, name: str) -> Path:
    path = shots / name
    assert driver.save_screenshot(str(path)), f"no screenshot {name}"
    SHOTS_COPY.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SHOTS_COPY / name)
    return path


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(live: LiveServer, downloads: Path):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        why = f"missing {', '.join(missing)}: run `make browser` (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):  # in CI a failure, never a skip: `make test` installs them there
            pytest.fail(why)
        pytest.skip(why)  # a machine without Debian's packages (a Mac) can still run the rest
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    driver.set_script_timeout(WAIT)
    yield driver
    driver.quit()


def console_errors(driver) -> list[str]:
    """Console errors since the last call (reading the log empties it)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def page(driver) -> dict:
    return js(driver, "return Object.assign({}, window.edgespecPage || {})")


def visible(driver, css: str) -> bool:
    return bool(js(driver, "const e = document.querySelector(arguments[0]); return !!e && e.offsetParent !== null",
                   css))


def settings(driver, **values) -> None:
    for name, value in values.items():
        js(driver, "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                   "e.dispatchEvent(new Event('change'))", name, str(value))


def send(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def open_page(driver, live: LiveServer, key: str | None = KEY) -> None:
    """The page in a fresh state with ``key`` in the tab's session storage, connected to the model."""
    driver.get(live.url + "/static/style.css")  # the origin, without the page's script running on old storage
    js(driver, "localStorage.clear(); sessionStorage.clear(); if (arguments[0]) sessionStorage.setItem("
               "'edgespec.key', arguments[0])", key)
    driver.get(live.url + "/")
    if key == KEY:
        wait_until(lambda: page(driver).get("model") == "tiny", "the page to read /v1/models")


def new_chat(driver) -> None:
    js(driver, "document.getElementById('new').click()")


def reply_done(driver, replies: int) -> dict:
    """The page's probe once ``replies`` replies have ended, waited for inside the page (the script timeout bounds
    it), so that no WebDriver polling competes with the server for the CPU meanwhile."""
    return driver.execute_async_script(
        "const [n, done] = arguments; const t = setInterval(() => { const p = window.edgespecPage;"
        " if (p.replies >= n && !p.busy) { clearInterval(t); done(Object.assign({}, p)); } }, 10);",
        replies,
    )


def assistant_text(driver) -> str:
    return js(driver, "const m = [...document.querySelectorAll('.msg.assistant .body')]; "
                      "return m.length ? m[m.length - 1].innerText : ''")


@pytest.mark.real
@pytest.mark.browser
def test_page_asks_for_the_key_and_loads_without_console_errors(browser, live: LiveServer, shots: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, live, key=None)
    wait_until(lambda: visible(browser, "#keybox form"), "the page to ask for the key")
    assert "needs an API key" in browser.find_element(By.ID, "keymsg").text
    box = browser.find_element(By.ID, "key")
    box.send_keys(KEY)
    box.send_keys(Keys.ENTER)  # keyboard only
    wait_until(lambda: page(browser).get("model") == "tiny", "the page to read /v1/models")
    pair = browser.find_element(By.ID, "pair").text
    assert "target" in pair and "draft" in pair and "CPU" in pair
    assert console_errors(browser) == []


@pytest.mark.real
@pytest.mark.browser
def test_wrong_key_says_so(browser, live: LiveServer):
    from selenium.webdriver.common.by import By

    open_page(browser, live, key="not-the-key")
    wait_until(lambda: visible(browser, "#keybox form"), "the page to ask for the key again")
    assert "API key is wrong" in browser.find_element(By.ID, "keymsg").text
    errors = console_errors(browser)  # the browser reports the refused request itself, nothing else
    assert all("401" in e for e in errors), errors


@pytest.mark.real
@pytest.mark.browser
def test_reply_streams_coloured_with_a_live_strip_and_a_chart(browser, live: LiveServer, shots: Path):
    live.wait_idle()
    open_page(browser, live)
    settings(browser, temperature=0, max_tokens=48)
    send(browser, PROMPT)
    seen: set[int] = set()  # lengths of the reply's text while it streams
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and (page(browser)["busy"] or not seen) and len(seen) < 400:
        if page(browser)["busy"]:
            seen.add(len(assistant_text(browser)))
        time.sleep(0.05)
    reply_done(browser, 1)
    assert len(seen - {0}) >= 2, f"the reply did not stream in: lengths seen {sorted(seen)}"
    text = assistant_text(browser)
    expected = api_client(live).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=48, temperature=0
    ).choices[0].message.content
    stored = js(browser, "return JSON.parse(localStorage.getItem('edgespec.conversations.v1'))[0].messages[1]")
    assert stored["content"] == expected  # the same greedy reply as through the API
    assert "".join(p["text"] for p in stored["pieces"]) == expected
    if "```" in expected:  # Markdown rendered: the fence is a code block, not text
        assert js(browser, "return document.querySelectorAll('.msg.assistant pre code').length") > 0
        assert "```" not in text
    counts = js(browser, "const q = (s) => document.querySelectorAll('.msg.assistant ' + s).length;"
                         "return {draft: q('.o-draft'), target: q('.o-target'), bars: q('svg.rounds rect')}")
    assert counts["draft"] > 0 and counts["bars"] > 0, counts
    assert visible(browser, "#strip")
    strip = js(browser, "return Object.fromEntries([...document.querySelectorAll('#strip [data-k]')]"
                        ".map(e => [e.dataset.k, e.textContent]))")
    assert strip["drafter"] in ("model", "lookup", "none") and float(strip["tps"]) > 0, strip
    summary = js(browser, "return document.querySelector('.msg.assistant .summary').textContent")
    assert "acceptance" in summary and "tokens/verify" in summary and "speedup" in summary, summary
    assert console_errors(browser) == []
    save_shot(browser, shots, "page-desktop-1280.png")


@pytest.mark.real
@pytest.mark.browser
def test_reload_keeps_the_conversation(browser, live: LiveServer, downloads: Path):
    before = assistant_text(browser)
    assert before
    browser.refresh()
    wait_until(lambda: page(browser).get("model") == "tiny", "the page to reconnect")
    assert assistant_text(browser) == before
    assert js(browser, "return document.querySelectorAll('.msg.assistant .o-draft').length") > 0
    assert js(browser, "return document.querySelectorAll('.msg.user').length") == 1
    stored = js(browser, "return JSON.parse(localStorage.getItem('edgespec.conversations.v1'))")
    assert stored[0]["messages"][0]["content"] == PROMPT
    js(browser, "document.getElementById('export').click()")
    files = wait_until(lambda: [p for p in downloads.glob("edgespec-*.json")], "the exported conversation")
    exported = json.loads(wait_until(lambda: files[0].read_text() or None, "the export to be written"))
    assert exported["model"] == "tiny"
    assert [m["content"] for m in exported["messages"]] == [m["content"] for m in stored[0]["messages"]]
    assert console_errors(browser) == []


@pytest.mark.real
@pytest.mark.browser
def test_shift_enter_is_a_new_line_not_a_send(browser, live: LiveServer):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys("first line")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    box.send_keys("second line")
    assert box.get_attribute("value") == "first line\nsecond line"
    assert not page(browser)["busy"] and js(browser, "return document.querySelectorAll('.msg').length") == 2
    box.clear()


@pytest.mark.real
@pytest.mark.browser
def test_phone_width(browser, live: LiveServer, shots: Path):
    browser.set_window_size(390, 844)
    try:
        browser.refresh()
        wait_until(lambda: page(browser).get("model") == "tiny", "the page to reconnect")
        overflow = js(browser, "return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than a phone"
        assert visible(browser, "#send") and visible(browser, "#stop")
        save_shot(browser, shots, "page-phone-390.png")
    finally:
        browser.set_window_size(1280, 900)


@pytest.mark.real
@pytest.mark.browser
def test_escape_stops_the_reply_and_the_server_cancels(browser, live: LiveServer, shots: Path):
    live.wait_idle()
    open_page(browser, live)
    settings(browser, temperature=0, max_tokens=2000)
    cancelled = metric(live, "edgespec:requests_cancelled_total")
    send(browser, "Count from 1 to 1000, separated by commas.")
    wait_until(lambda: len(assistant_text(browser)) > 20, "the reply to begin")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.find_element(By.ID, "prompt").send_keys(Keys.ESCAPE)
    reply_done(browser, 1)
    wait_until(lambda: metric(live, "edgespec:requests_cancelled_total") >= cancelled + 1, "the server to cancel")
    summary = js(browser, "return document.querySelector('.msg.assistant .summary').textContent")
    assert summary.startswith("stopped"), summary
    assert live.jobs[-1].outcome.finished.finish_reason == "cancelled"
    assert live.jobs[-1].outcome.finished.stats.generated < 2000
    assert console_errors(browser) == []


@pytest.mark.real
@pytest.mark.browser
def test_draft_len_auto_gives_a_speedup_estimate(browser, live: TimedServer, shots: Path):
    """With draft_len auto the controller measures plain decoding, and the page shows the reply's speedup: the
    number the finishing chunk's ``edgespec.summary`` carries."""
    live.wait_idle()
    open_page(browser, live)
    settings(browser, temperature=0, max_tokens=32, draft_mode="auto", lookup="on")
    send(browser, PROMPT)
    reply_done(browser, 1)
    stored = js(browser, "return JSON.parse(localStorage.getItem('edgespec.conversations.v1'))[0].messages[1]")
    gain = stored["summary"]["speedup"]
    assert gain and gain > 0, stored["summary"]
    assert stored["speculation"]["draft_len"] == "auto" and stored["speculation"]["lookup"] is True
    summary = js(browser, "return document.querySelector('.msg.assistant .summary').textContent")
    assert f"speedup ≈ {gain:.2f}×" in summary, summary
    assert console_errors(browser) == []
    save_shot(browser, shots, "page-desktop-1280-auto.png")


@pytest.mark.real
@pytest.mark.browser
def test_markdown_escapes_html_and_keeps_each_origin(browser, live: LiveServer):
    """The page's renderer, run in the page: model text never becomes markup, and origins survive Markdown."""
    render = (
        "const [pieces, done] = arguments;"
        "import('/static/markdown.js').then((m) => done(m.render(pieces)), (e) => done('failed: ' + e));"
    )
    html = browser.execute_async_script(render, [{"text": "<img src=x onerror=alert(1)> & **bo", "origin": "target"},
                                                 {"text": "ld** `co", "origin": "draft"},
                                                 {"text": "de`\n\n- item\n```py\nx < 1\n```", "origin": "lookup"}])
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt; &amp; " in html
    assert '<strong><span class="o-target">bo</span><span class="o-draft">ld</span></strong>' in html
    assert '<code><span class="o-draft">co</span><span class="o-lookup">de</span></code>' in html
    assert '<ul><li><span class="o-lookup">item</span></li></ul>' in html
    assert '<pre><code data-lang="py"><span class="o-lookup">x &lt; 1</span></code></pre>' in html


@pytest.mark.real
@pytest.mark.browser
def test_first_token_in_the_page_as_fast_as_through_the_api(browser, live: TimedServer, shots: Path):
    """The same greedy request, alternately from the page (send → first text in the DOM, timed by the page) and from
    the openai client (create → first content chunk), after a warm-up so that both reuse the same cached prompt.

    On a loaded 2-core machine the server's own time to the first chunk varies by whole seconds between two runs of
    the same request, so the assertion is on what each client adds to it (client TTFT − the server's, measured per
    request by :class:`TimedServer`); the raw TTFTs are reported beside it.
    """
    messages = [{"role": "user", "content": "Say hello."}]
    client = api_client(live)

    def server_ms(before: int) -> float:
        wait_until(lambda: len(live.first_content) > before, "the server's timing of the request")
        return live.first_content[-1]

    def through_api() -> tuple[float, float]:
        live.wait_idle()
        before = len(live.first_content)
        t0 = time.perf_counter()
        stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                                stream=True)
        ttft = None
        for c in stream:
            if ttft is None and c.choices and c.choices[0].delta.content:
                ttft = (time.perf_counter() - t0) * 1000
        assert ttft is not None
        return ttft, server_ms(before)

    def through_page(n: int) -> tuple[float, float]:
        live.wait_idle()
        new_chat(browser)
        before = len(live.first_content)
        send(browser, messages[0]["content"])
        return reply_done(browser, n)["ttft_ms"], server_ms(before)

    open_page(browser, live)
    settings(browser, temperature=0, max_tokens=8)
    through_api()
    page, api = [], []
    for i in range(TTFT_TRIALS):  # alternating, so that the machine's load drifts over both alike
        page.append(through_page(i + 1))
        api.append(through_api())
    med = statistics.median
    result = {
        "trials": TTFT_TRIALS,
        "page_ttft_ms": [round(t, 1) for t, _ in page], "api_ttft_ms": [round(t, 1) for t, _ in api],
        "page_server_ms": [round(s, 1) for _, s in page], "api_server_ms": [round(s, 1) for _, s in api],
        "page_median_ms": med(t for t, _ in page), "api_median_ms": med(t for t, _ in api),
        "page_min_ms": min(t for t, _ in page), "api_min_ms": min(t for t, _ in api),
        "page_added_median_ms": med(t - s for t, s in page), "api_added_median_ms": med(t - s for t, s in api),
    }
    (shots / "ttft.json").write_text(json.dumps(result, indent=1))
    SHOTS_COPY.mkdir(parents=True, exist_ok=True)
    shutil.copy(shots / "ttft.json", SHOTS_COPY / "ttft.json")
    print(f"time to first token, median of {TTFT_TRIALS}: page {result['page_median_ms']:.1f} ms, "
          f"api {result['api_median_ms']:.1f} ms; added to the server's own: page {result['page_added_median_ms']:.1f}"
          f" ms, api {result['api_added_median_ms']:.1f} ms")
    assert result["page_added_median_ms"] <= result["api_added_median_ms"] + 50, result
    assert console_errors(browser) == []
