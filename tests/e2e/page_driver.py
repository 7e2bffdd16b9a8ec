#!/usr/bin/python3
"""Drives the profile page in headless Chromium over the DevTools protocol, as a person at
the keyboard would, and prints what it saw as one JSON object for the e2e test to check.

  page_driver.py keyboard BASE USER PASSWORD PATH SHOTS
      Opens BASE+PATH (the page of the known workload's process), then: "/" and typing
      "hot_one" (search), Escape (search cleared), Tab into the graph, the arrow keys down
      to hot_one and Enter (zoom), the browser's Back and Forward, and Escape (zoom out).
  page_driver.py render BASE USER PASSWORD PATH SHOTS NODES
      Opens BASE+PATH with the page's data replaced by a tree of NODES nodes (the daemon's
      data with another root), each wide enough to be drawn, and measures in the browser
      the time from a redraw to the frame after it, and a whole reload.

Screenshots go to SHOTS. Uses python3-websocket for the protocol's WebSocket.
"""
import base64
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

from websocket import create_connection


class Page:
    def __init__(self, user_dir):
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--ignore-certificate-errors", "--remote-debugging-port=0",
             "--user-data-dir=" + user_dir, "--window-size=1400,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._port(os.path.join(user_dir, "DevToolsActivePort"))
            with urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            self.ws = create_connection(pages[0]["webSocketDebuggerUrl"], timeout=120,
                                        suppress_origin=True)
        except BaseException:
            self._stop()
            raise
        self.next_id = 0
        self.events = []

    def _port(self, port_file):
        deadline = time.monotonic() + 60
        while True:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    words = f.read().split()
                if words:
                    return words[0]
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium gave no DevTools port")
            time.sleep(0.05)

    def _stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.ws.close()
        self._stop()

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def event(self, method):
        """The next event `method`, kept or to come."""
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression, await_promise=False):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=await_promise)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expression, seconds=60):
        deadline = time.monotonic() + seconds
        while not self.eval("(() => { try { return " + expression + "; } catch (e) { return false; } })()"):
            if time.monotonic() > deadline:
                raise RuntimeError("never true: " + expression)
            time.sleep(0.05)

    # Keys as a keyboard sends them: (key, code, virtual key code, text).
    KEYS = {
        "/": ("/", "Slash", 191, "/"), "Escape": ("Escape", "Escape", 27, ""),
        "Enter": ("Enter", "Enter", 13, "\r"), "Tab": ("Tab", "Tab", 9, ""),
        "ArrowDown": ("ArrowDown", "ArrowDown", 40, ""), "ArrowUp": ("ArrowUp", "ArrowUp", 38, ""),
        "ArrowLeft": ("ArrowLeft", "ArrowLeft", 37, ""),
        "ArrowRight": ("ArrowRight", "ArrowRight", 39, ""),
    }

    def key(self, name):
        key, code, vk, text = self.KEYS[name]
        down = {"type": "keyDown" if text else "rawKeyDown", "key": key, "code": code,
                "windowsVirtualKeyCode": vk}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", **down)
        self.call("Input.dispatchKeyEvent", type="keyUp", key=key, code=code,
                  windowsVirtualKeyCode=vk)

    def history(self, step):
        h = self.call("Page.getNavigationHistory")
        entry = h["entries"][h["currentIndex"] + step]
        self.call("Page.navigateToHistoryEntry", entryId=entry["id"])

    def screenshot(self, path):
        png = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))


FOCUSED = "document.activeElement"
FOCUSED_NAME = FOCUSED + ".dataset.name || ''"
# The first bar drawn: the node the view is zoomed to, as wide as the graph.
TOP = "(() => { const b = document.querySelector('#graph .f'); return b ? " \
      "[b.dataset.name, b.style.width] : null; })()"
LOADED = "document.body.dataset.loaded === '1'"


def keyboard(page, url, shots):
    out = {}
    page.call("Page.navigate", url=url)
    page.wait_for(LOADED)
    out["top"] = page.eval(TOP)
    out["bars"] = page.eval("document.querySelectorAll('#graph .f').length")
    # Search: "/" goes to the box, typing marks the bars, Escape clears it.
    page.key("/")
    out["slash_focus"] = page.eval(FOCUSED + ".id")
    page.call("Input.insertText", text="hot_one")
    out["matched"] = page.eval("document.querySelectorAll('#graph .f.match').length")
    out["status"] = page.eval("document.getElementById('status').textContent")
    page.screenshot(os.path.join(shots, "profile-keyboard-search.png"))
    page.key("Escape")
    out["search_after_escape"] = page.eval("document.getElementById('search').value")
    out["matched_after_escape"] = page.eval("document.querySelectorAll('#graph .f.match').length")
    # Tab from the search box to the graph's first bar.
    tabs = 0
    while tabs < 60 and not page.eval(FOCUSED + ".classList.contains('f')"):
        page.key("Tab")
        tabs += 1
    out["tabs_to_graph"] = tabs
    out["first_focused"] = page.eval(FOCUSED_NAME)
    # Down the widest callees (to hot_three), then beside it to hot_one.
    path = []
    for _ in range(40):
        name = page.eval(FOCUSED_NAME)
        path.append(name)
        if name == "hot_one":
            break
        if name in ("hot_three", "sort_round"):
            # Its siblings: to the right first, then to the left.
            for step in ["ArrowRight"] * 4 + ["ArrowLeft"] * 8:
                page.key(step)
                if page.eval(FOCUSED_NAME) == "hot_one":
                    break
        else:
            page.key("ArrowDown")  # the widest callee
    out["path"] = path
    page.key("Enter")
    out["zoomed"] = page.eval(TOP)
    out["zoomed_focus"] = page.eval(FOCUSED_NAME)
    # Enter again on the zoomed bar: no new step in the history.
    entries = len(page.call("Page.getNavigationHistory")["entries"])
    page.key("Enter")
    out["history_steps_of_second_enter"] = \
        len(page.call("Page.getNavigationHistory")["entries"]) - entries
    page.screenshot(os.path.join(shots, "profile-keyboard-zoom.png"))
    # The browser's Back returns to the whole view, Forward to the zoom; Escape zooms out.
    page.history(-1)
    page.wait_for("document.querySelector('#graph .f').dataset.name !== 'hot_one'")
    out["after_back"] = page.eval(TOP)
    out["focus_after_back"] = page.eval(FOCUSED_NAME)
    page.history(+1)
    page.wait_for("document.querySelector('#graph .f').dataset.name === 'hot_one'")
    out["after_forward"] = page.eval(TOP)
    out["focus_after_forward"] = page.eval(FOCUSED_NAME)
    page.key("Escape")
    page.wait_for("document.querySelector('#graph .f').dataset.name !== 'hot_one'")
    out["after_escape"] = page.eval(TOP)
    out["focus_after_escape"] = page.eval(FOCUSED_NAME)
    out["bars_after_escape"] = page.eval("document.querySelectorAll('#graph .f').length")
    return out


def tree(nodes):
    """A root with nodes / 10 callees of equal time, each the top of a chain of 10."""
    chains = max(1, nodes // 10)
    root = {"n": "all", "on": 0, "off": 0, "c": []}
    for i in range(chains):
        node = {"n": "caller_%d" % i, "on": 1000000, "off": 0}
        top = node
        for d in range(1, 10):
            child = {"n": "function_%d_%d" % (i, d), "on": 1000000, "off": 0}
            node["c"] = [child]
            node = child
        root["c"].append(top)
        root["on"] += top["on"]
    return root


def render(page, url, base, auth, nodes, shots):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(base + "/profile/data?seconds=60&view=on",
                                 headers={"Authorization": auth})
    with urllib.request.urlopen(req, context=ctx) as r:
        data = json.load(r)
    data["root"] = tree(nodes)
    data["pruned"] = 0
    body = base64.b64encode(json.dumps(data).encode()).decode()
    page.call("Fetch.enable", patterns=[{"urlPattern": "*/profile/data*"}])
    page.call("Page.navigate", url=url)
    out = {}
    # Every fetch of the data, the page's first and its reloads, gets the tree.
    def fulfil():
        e = page.event("Fetch.requestPaused")
        page.call("Fetch.fulfillRequest", requestId=e["params"]["requestId"], responseCode=200,
                  responseHeaders=[{"name": "Content-Type", "value": "application/json"}],
                  body=body)
    fulfil()
    page.wait_for(LOADED)
    out["nodes"] = page.eval(
        "(() => { let k = 0; const walk = (n) => { k++; (n.c || []).forEach(walk); };"
        " walk(data.root); return k; })()")
    out["bars"] = page.eval("document.querySelectorAll('#graph .f').length")
    page.screenshot(os.path.join(shots, "profile-render-cap.png"))
    frame = "new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
    # A redraw (the reset button: the same data drawn again), to the frame after it.
    # A redraw (as each key typed in the search box makes; the event returns once the bars
    # are made, the page's script alone), and to the frame after it.
    draws = []
    for _ in range(5):
        draws.append(page.eval(
            "(async () => { const t0 = performance.now();"
            " document.getElementById('search').dispatchEvent(new Event('input'));"
            " const t1 = performance.now(); await " + frame +
            "; return [performance.now() - t0, t1 - t0]; })()", await_promise=True))
    draws.sort()
    out["draw_ms"], out["script_ms"] = draws[len(draws) // 2]
    # A reload: fetch, parse, index and draw, to the frame after it.
    page.eval("document.body.dataset.loaded = ''; window.t0 = performance.now();"
              " document.getElementById('reload').click(); 0")
    fulfil()
    page.wait_for(LOADED)
    out["reload_ms"] = page.eval("(async () => { await " + frame +
                                 "; return performance.now() - window.t0; })()",
                                 await_promise=True)
    return out


def main():
    mode, base, user, password, path, shots = sys.argv[1:7]
    auth = "Basic " + base64.b64encode((user + ":" + password).encode()).decode()
    os.makedirs(shots, exist_ok=True)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as user_dir:
        page = Page(user_dir)
        try:
            page.call("Page.enable")
            page.call("Runtime.enable")
            page.call("Network.enable")
            page.call("Network.setExtraHTTPHeaders", headers={"Authorization": auth})
            if mode == "keyboard":
                out = keyboard(page, base + path, shots)
            else:
                out = render(page, base + path, base, auth, int(sys.argv[7]), shots)
        finally:
            page.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
