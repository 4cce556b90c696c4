"""The study server stays responsive while participants send the donation parser its worst input.

Starts the real server (``scope study serve``: uvicorn, a real SQLite file, a scripted agent), brings
8 participants to the donation stage, then has all 8 post donation statements at once, over and over
for ``--seconds``: each the parser's worst case at the length the server accepts (300 characters of
"5 5 5 ..."; its time grows with the square of the length), plus one over-long statement each round
(refused before parsing). Meanwhile a separate client times a plain ``GET /`` every 50 ms. The
parser runs off the event loop, so the GETs must not wait for it.

    python bench/study_hostile.py [--seconds 5]

Ends with: RESULT in_flight=8 get_p50_ms=... get_max_ms=... donation_posts=N donation_p50_ms=... errors_5xx=E
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time

import httpx
from study_load import AGENT, free_port, new_study, reply_arrived, start_server

IN_FLIGHT = 8
WORST = ("5 " * 150)[:300]  # at the server's cap (DONATION_CHARS)


async def to_donation(client: httpx.AsyncClient, token: str) -> None:
    (await client.post(f"/api/{token}/consent", json={})).raise_for_status()
    (await client.post(f"/api/{token}/start", json={})).raise_for_status()
    await reply_arrived(client, token)
    (await client.post(f"/api/{token}/messages", json={"text": "Why?"})).raise_for_status()
    await reply_arrived(client, token)
    (await client.post(f"/api/{token}/end", json={})).raise_for_status()


async def hostile(client: httpx.AsyncClient, token: str, until: float, posts: list[float], statuses: list[int]) -> None:
    while time.perf_counter() < until:
        for text in (WORST, "5 " * 50_000):
            clock = time.perf_counter()
            response = await client.post(f"/api/{token}/donation", json={"text": text})
            statuses.append(response.status_code)
            if text is WORST:
                posts.append(time.perf_counter() - clock)


async def prober(base: str, until: float, gets: list[float], statuses: list[int]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:  # its own connection
        while time.perf_counter() < until:
            clock = time.perf_counter()
            response = await client.get("/")
            gets.append(time.perf_counter() - clock)
            statuses.append(response.status_code)
            await asyncio.sleep(0.05)


async def run(base: str, tokens: list[str], seconds: float) -> tuple[list[float], list[float], list[int]]:
    gets: list[float] = []
    posts: list[float] = []
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=4 * IN_FLIGHT)) as client:
        await asyncio.gather(*(to_donation(client, t) for t in tokens))
        until = time.perf_counter() + seconds
        await asyncio.gather(prober(base, until, gets, statuses), *(hostile(client, t, until, posts, statuses) for t in tokens))
    return gets, posts, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    work, db, tokens, _ = new_study(
        "Hostile donations", f"  - {{name: a, model: '{AGENT}'}}\n", "{requests_per_minute: 6000}", 20, IN_FLIGHT
    )
    server, base = start_server(work, work / "study.yaml", db, free_port())
    try:
        gets, posts, statuses = asyncio.run(run(base, tokens, args.seconds))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    get_ms = sorted(x * 1000 for x in gets)
    post_ms = sorted(x * 1000 for x in posts)
    errors = sum(code >= 500 for code in statuses)
    print(f"{'GET / while donations in flight (ms)':<44}p50 {statistics.median(get_ms):.1f}  max {get_ms[-1]:.1f}  ({len(get_ms)} GETs)")
    print(f"{'worst-case donation posts (ms)':<44}p50 {statistics.median(post_ms):.1f}  max {post_ms[-1]:.1f}  ({len(post_ms)} posts)")
    print(f"{'answers 5xx':<44}{errors}")
    print(
        f"RESULT in_flight={IN_FLIGHT} get_p50_ms={statistics.median(get_ms):.1f} get_max_ms={get_ms[-1]:.1f} "
        f"donation_posts={len(post_ms)} donation_p50_ms={statistics.median(post_ms):.1f} errors_5xx={errors}"
    )


if __name__ == "__main__":
    main()
