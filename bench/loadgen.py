"""An open-loop HTTP load generator: requests at a fixed arrival rate, whatever the server answers.

A closed loop (each client waits for its answer before it sends the next request) slows its own arrivals as
the server slows, and so hides the queue ("coordinated omission"). Here each of ``clients`` streams sends
``rate`` requests a second, evenly spaced (the streams offset from one another), each request its own task; a
latency counts from the moment its request was due, not from when it left. Requests still unanswered
``grace`` seconds after the last one was due are errors (``timeout``). So below the server's capacity the
achieved rate is the offered one and the latencies are the server's own; past it the achieved rate is the
capacity, and the queue shows as latency or as refusals (HTTP 503), counted per kind.

:func:`saturate` is the closed loop, kept for one question only: how many answers a second ``clients`` clients get
when each sends its next request as soon as it has its answer (the server's capacity at that concurrency).

>>> schedule(clients=2, rate=2.0, duration=1.0)
[0.0, 0.25, 0.5, 0.75]
>>> summary([0.010, 0.020, 0.030, 0.040], {"HTTP 503": 1}, wall=2.0)
{'requests': 5, 'ok': 4, 'qps': 2.0, 'p50_ms': 20.0, 'p95_ms': 40.0, 'p99_ms': 40.0, 'errors': {'HTTP 503': 1}}
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter

__all__ = ["percentile", "run", "saturate", "schedule", "summary"]


def schedule(clients: int, rate: float, duration: float) -> list[float]:
    """When each request is due, in seconds from the start: every client ``rate`` a second for ``duration``."""
    per_client = int(duration * rate)
    return sorted(c / (clients * rate) + i / rate for c in range(clients) for i in range(per_client))


def percentile(ordered: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``ordered`` (ascending), NaN when empty.

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 4], 99)
    (2, 4)
    """
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(latencies: list[float], errors: dict[str, int], wall: float) -> dict:
    """Answered requests a second over ``wall`` (from the first due time to the last answer), the latencies of the
    answered ones (ms), and the errors by kind."""
    ordered = sorted(latencies)
    ms = {f"p{p}_ms": round(percentile(ordered, p) * 1000, 1) for p in (50, 95, 99)}
    return {
        "requests": len(ordered) + sum(errors.values()),
        "ok": len(ordered),
        "qps": round(len(ordered) / wall, 2) if wall > 0 else 0.0,
        **ms,
        "errors": dict(sorted(errors.items())),
    }


async def _one(client, url: str, body: dict, due: float, latencies: list, errors: Counter, last: list) -> None:
    import httpx

    loop = asyncio.get_running_loop()
    try:
        answer = await client.post(url, json=body)
    except httpx.TimeoutException:
        errors["timeout"] += 1
        return
    except httpx.HTTPError as e:
        errors[type(e).__name__] += 1
        return
    if answer.status_code == 200:
        latencies.append(loop.time() - due)
        last[0] = max(last[0], loop.time())
    else:
        errors[f"HTTP {answer.status_code}"] += 1


async def _run(url: str, bodies: list[dict], clients: int, rate: float, duration: float, grace: float) -> dict:
    import httpx

    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors: Counter = Counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(clients, 8))
    async with httpx.AsyncClient(timeout=httpx.Timeout(duration + grace), limits=limits) as client:
        start = loop.time() + 0.05
        last = [start]
        tasks = []
        for i, due in enumerate(schedule(clients, rate, duration)):
            if (wait := start + due - loop.time()) > 0:
                await asyncio.sleep(wait)
            body = bodies[i % len(bodies)]
            tasks.append(asyncio.ensure_future(_one(client, url, body, start + due, latencies, errors, last)))
        _, late = await asyncio.wait(tasks, timeout=max(0.0, start + duration + grace - loop.time()))
        for task in late:
            task.cancel()
        errors["timeout"] += len(late)
    return summary(latencies, +errors, last[0] - start)


def run(url: str, bodies: list[dict], clients: int, rate: float, duration: float, grace: float = 60) -> dict:
    """POST ``bodies`` (in turn) to ``url``: ``clients`` streams of ``rate`` requests a second for ``duration``
    seconds; :func:`summary` of what came back, with the offered rate."""
    result = asyncio.run(_run(url, bodies, clients, rate, duration, grace))
    return {"clients": clients, "offered_qps": round(clients * rate, 2), **result}


async def _saturate(url: str, bodies: list[dict], clients: int, duration: float) -> dict:
    import httpx

    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors: Counter = Counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(duration + 60), limits=limits) as client:
        start = loop.time()
        last = [start]

        async def one_client(c: int) -> None:
            i = c
            while loop.time() < start + duration:
                sent = loop.time()
                await _one(client, url, bodies[i % len(bodies)], sent, latencies, errors, last)
                i += clients

        await asyncio.gather(*(one_client(c) for c in range(clients)))
    return summary(latencies, +errors, last[0] - start)


def saturate(url: str, bodies: list[dict], clients: int, duration: float) -> dict:
    """Closed loop: ``clients`` clients, each sending its next request when the last is answered, for
    ``duration`` seconds; :func:`summary` of what came back (its q/s is the capacity at that concurrency)."""
    return {"clients": clients, **asyncio.run(_saturate(url, bodies, clients, duration))}
