"""How fast `cts view` opens a large run in a real browser: 10,000 synthetic records (2,000
instances x 5 conditions, answers, dialogues and judged nuggets of realistic size) in a temp
run directory, `cts view` started on it, and headless Chromium timing the index from navigation
start to its first page of rows rendered; also the index sorted by score with a filter, and a
sample page whose trace has 40 model turns.

Not a test: prints figures and writes them as JSON. Needs Chromium and chromedriver
(scripts/chromium.sh) and selenium (the dev extra).
`python bench/view.py [--records N] [--loads K] [--json PATH]`
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.records import RecordStore, write_jsonl
from cts.eval.run.run_dir import RunDir, Shard

ROOT = Path(__file__).resolve().parent.parent
CONDITIONS: list[str] = list(ALL_CONDITIONS)
WORDS = "battery charge hours case earbuds noise cancelling model region year price".split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def trace(rng: random.Random, turns: int) -> dict[str, Any]:
    """A search run of `turns` model calls, each searching, with ten hits a search."""
    steps: list[dict[str, Any]] = []
    for t in range(turns):
        call = json.dumps({"name": "search", "arguments": {"query": [text(rng, 4)]}})
        steps.append(
            {
                "kind": "llm",
                "final": False,
                "cached": False,
                "prompt_tokens": 900,
                "completion_tokens": 80,
                "text": f"<think>\n{text(rng, 60)}\n</think>\n<tool_call>\n{call}\n</tool_call>",
            }
        )
        hits = "\n\n".join(
            f"{i}. [{text(rng, 6)}](https://site{t}-{i}.example/page)\n\n{text(rng, 50)}"
            for i in range(1, 11)
        )
        steps.append(
            {
                "kind": "tool",
                "tool": "search",
                "arguments": {"query": ["q"]},
                "result": f"A Google search for 'q' found 10 results:\n\n## Web Results\n{hits}",
                "doc_ids": [f"D-{t}-{i}" for i in range(1, 11)],
                "urls": [f"https://site{t}-{i}.example/page" for i in range(1, 11)],
                "errors": {},
                "cached": False,
                "evidence": [
                    {"id": f"D-{t}-{i}", "url": f"https://site{t}-{i}.example/page"}
                    for i in range(1, 11)
                ],
            }
        )
    steps.append(
        {
            "kind": "llm",
            "final": True,
            "cached": False,
            "text": f"<think>\ndone\n</think>\n<answer>\n{text(rng, 80)}\n</answer>",
        }
    )
    return {
        "answer": "",
        "termination": "answer",
        "messages": [],
        "steps": steps,
        "llm_calls": turns + 1,
        "seconds": 1.0,
        "error": None,
    }


def write_run(root: Path, count: int, rng: random.Random) -> Record:
    """`count` records (failures and all-unknown dialogues among them); the first one gets a
    40-turn trace, and is returned."""
    RunDir(root).write_config(load_experiment("quickstart", ["seeds=[0]"]))
    instances = count // len(CONDITIONS)
    made: list[Record] = []
    for i in range(instances):
        for condition in CONDITIONS:
            k = int(condition[-1]) if condition.startswith("clarify@") else 0
            failed = rng.random() < 0.03
            answer = text(rng, 90)
            made.append(
                Record(
                    instance_id=f"I-{i:05d}",
                    condition=condition,
                    seed=0,
                    language=rng.choice(["en", "zh"]),
                    removed_constraints=[rng.choice(["time", "region", "entity", "scope"])],
                    questions=[text(rng, 8) + "?" for _ in range(k)],
                    answers=[rng.choice(["unknown", text(rng, 3)]) for _ in range(k)],
                    question_types=[["time"]] * k,
                    search_query=text(rng, 12),
                    answer=answer,
                    termination="error" if failed else "answer",
                    labels={}
                    if failed
                    else {
                        f"n{j}": {
                            "label": rng.choice(["full", "partial", "none"]),
                            "evidence": answer[10 * j : 10 * j + 30],
                        }
                        for j in range(5)
                    },
                    scores={} if failed else {"restore_score_100": rng.uniform(0, 100)},
                    error={"kind": "search_error", "stage": "search", "message": "boom"}
                    if failed
                    else None,
                )
            )
    first = made[0]
    first.trace_id = "blurred/first.json"
    (RunDir(root).traces / "blurred").mkdir(parents=True)
    (RunDir(root).traces / first.trace_id).write_text(json.dumps(trace(rng, 40)))
    store = RecordStore(root)
    for condition in CONDITIONS:
        path = store.path(condition, Shard())
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, (r for r in made if r.condition == condition))
    return first


def start_view(run: Path) -> tuple[subprocess.Popen[str], str, float]:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "cts", "view", str(run), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(r"cts view: (http://\S+/)", line)
        if found:
            return process, found.group(1), time.perf_counter() - started
    raise SystemExit(f"cts view did not start (exit {process.wait()})")


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def load_ms(driver: Any, url: str, view: str) -> float:
    """Navigation start → the view rendered, in ms (the page's own clock)."""
    driver.get("about:blank")
    driver.get(url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = driver.execute_script(
            "return (window.__ctsFirstRendered || {})[arguments[0]] ?? null", view
        )
        if done is not None:
            return float(done)
        time.sleep(0.01)
    raise SystemExit(f"{url}: not rendered in 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=5, help="page loads timed per view")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        first = write_run(run, args.records, rng)
        process, url, startup = start_view(run)
        driver = browser()
        try:
            views = {
                "index": (url, "index"),
                "index, failed filtered out, by score": (
                    url + "#/?failed=0&sort=score&order=desc&limit=200",
                    "index",
                ),
                "sample, 40-turn trace": (
                    url + f"#/sample?run=0&instance={first.instance_id}&condition="
                    f"{first.condition}&seed=0",
                    "sample",
                ),
            }
            load_ms(driver, url, "index")  # the browser's own first start is not the page's
            figures: dict[str, Any] = {"records": args.records, "startup_s": round(startup, 2)}
            for name, (address, view) in views.items():
                times = [load_ms(driver, address, view) for _ in range(args.loads)]
                figures[name] = {
                    "median_ms": round(statistics.median(times)),
                    "max_ms": round(max(times)),
                }
        finally:
            driver.quit()
            process.terminate()
            process.wait()
    print(
        f"{args.records} records: `cts view` ready in {figures['startup_s']} s "
        "(reading every record)"
    )
    for name in views:
        print(
            f"  {name}: median {figures[name]['median_ms']} ms, "
            f"max {figures[name]['max_ms']} ms over {args.loads} loads "
            "(navigation start → rendered)"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
