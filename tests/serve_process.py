"""A real `pocketspec serve` in a subprocess on a free loopback port, for the server's tests: started, its
URL read from the line it prints, stopped with a signal, its stderr kept for assertions."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading

import httpx

from conftest import hang_up_as_a_terminal_does

SMOLLM2_FLAGS = ("--target", "smollm2-135m-instruct", "--draft", "ngram", "--threads", "1", "--port", "0")
URL_LINE = re.compile(r"listening on (http://\S+)")
START_SECONDS = 300  # a first run on a fresh machine measures the forward costs first


class ServerProcess:
    def __init__(self, *flags: str, env: dict[str, str] | None = None):
        self._stderr = tempfile.TemporaryFile(mode="w+")
        environment = {key: value for key, value in os.environ.items() if key != "POCKETSPEC_API_KEY"}
        self.process = subprocess.Popen([sys.executable, "-m", "apps.cli", "serve", *SMOLLM2_FLAGS, *flags],
                                        stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                        env={**environment, **(env or {})},
                                        preexec_fn=hang_up_as_a_terminal_does)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.url = self._wait_for_url()
        self.api_url = self.url + "/v1"

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _wait_for_url(self) -> str:
        while True:
            try:
                line = self._lines.get(timeout=START_SECONDS)
            except queue.Empty:
                self.stop(signal.SIGKILL)
                raise AssertionError(f"no URL line in {START_SECONDS} s: {self.stderr()}") from None
            if line is None:
                raise AssertionError(f"the server exited ({self.process.wait()}): {self.stderr()}")
            match = URL_LINE.search(line)
            if match:
                return match.group(1)

    def client(self, **options) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **options)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send `sig` and wait for the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def error_of(response: httpx.Response) -> dict:
    """The OpenAI error object of a response, checked for its four fields."""
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def metric_value(text: str, name: str, **labels) -> float:
    """One sample's value in /metrics' exposition text (0 where it is absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items()):
                return sample.value
    return 0.0
