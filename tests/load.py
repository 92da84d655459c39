"""A bounded Python load for the reliability tests: a few httpx threads on 127.0.0.1, each
POSTing one V2 body after another and recording what came back."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Answer:
    at: float  # time.monotonic() when the request was sent
    seconds: float
    status: int  # 0: no HTTP answer (connection refused, reset, timeout)
    version: str  # the response's model_version, or the error text
    worker: int


@dataclass
class Load:
    """``threads`` workers per URL until ``stop()``, each cycling through ``bodies``;
    ``answers`` grows meanwhile."""

    urls: list[str]
    bodies: list[str]
    threads: int = 2
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for index, url in enumerate(u for u in self.urls for _ in range(self.threads)):
            worker = threading.Thread(target=self._run, args=(index, url), daemon=True)
            self._workers.append(worker)
            worker.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    def _run(self, worker: int, url: str) -> None:
        with httpx.Client(timeout=30) as http:
            for body in itertools.cycle(self.bodies):
                if self._stop.is_set():
                    break
                sent = time.monotonic()
                try:
                    r = http.post(url, content=body,
                                  headers={"content-type": "application/json"})
                    status = r.status_code
                    version = r.json().get("model_version", r.text) if status == 200 else r.text
                except httpx.HTTPError as exc:
                    status, version = 0, f"{type(exc).__name__}: {exc}"
                self.answers.append(Answer(sent, time.monotonic() - sent, status,
                                           str(version), worker))

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    def for_url(self, url: str) -> list[Answer]:
        workers = {i for i, u in enumerate(u for u in self.urls for _ in range(self.threads))
                   if u == url}
        return [a for a in self.answers if a.worker in workers]


def p99(answers: list[Answer]) -> float:
    ordered = sorted(a.seconds for a in answers)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0
