"""A hop through the broker at the tail of a long partition: how the time from a record's
produce to its consumer's receipt grows with the records the partition already holds.

    python -m bench.broker_tail [--records 0 10000 20000 40000] [--seconds 4] [--smoke]

For each size: a topic of one partition of its own, filled with that many records of 1.5 KB
(a build request's size); a consumer (the dev stack's 2 ms long poll) placed at its end, then a
producer sends 20 pings a second for ``--seconds``, each timed from its send to the consumer's
receipt. Apache Kafka finds an offset through its index, whatever the partition's length;
Tansu's memory storage (the dev broker) measured otherwise, and a bench whose flood fills a
partition measures that too (docs/performance.md, issue 33's ``builds``). Prints figures;
never passes or fails. ``--smoke``: ``--records 0 1000 --seconds 1``, with every ping read (or
it exits non-zero).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from broker.settings import TopicSettings
from broker.topics import TopicSpec, all_topics, delete_topics, ensure_topics
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS, DevStack

BODY = b"x" * 1_500
PINGS_PER_S = 20


async def tail_hop(bootstrap: str, records: int, seconds: float) -> list[float]:
    """Milliseconds of each ping's hop, at the tail of a partition of ``records`` records."""
    topic = f"bench.tail.{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS
    )
    await producer.start()
    await consumer.start()
    hops: list[float] = []
    arrived = asyncio.Event()  # set on each ping read
    try:
        for start in range(0, records, 500):
            sends = [producer.send(topic, BODY) for _ in range(min(500, records - start))]
            await asyncio.gather(*(await asyncio.gather(*sends)))
        # at the tail at once: a fresh partition's next offset is the records sent (Tansu's end
        # offsets are wrong, and a 2 ms poll reading the whole partition may stall on it)
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, records)

        async def read() -> None:
            async for record in consumer:
                hops.append((time.perf_counter() - float(record.value or b"0")) * 1000)
                arrived.set()

        reader = asyncio.create_task(read())
        until = time.perf_counter() + seconds
        sent = 0
        while time.perf_counter() < until:
            await producer.send_and_wait(topic, str(time.perf_counter()).encode())
            sent += 1
            await asyncio.sleep(1 / PINGS_PER_S)
        with contextlib.suppress(TimeoutError):  # printed: the pings that never arrived
            async with asyncio.timeout(30):
                while len(hops) < sent:
                    arrived.clear()
                    await arrived.wait()
        reader.cancel()
        if len(hops) < sent:
            missing = sent - len(hops)
            print(f"  {records:6,} records before: {missing} of {sent} pings not read in 30 s")
    finally:
        await consumer.stop()
        await producer.stop()
        await delete_topics(bootstrap, [topic])
    return hops


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


SMOKE = {"records": [0, 1_000], "seconds": 1.0}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py)."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_tail", description=__doc__)
    parser.add_argument("--records", type=int, nargs="+", default=[0, 10_000, 20_000, 40_000])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    report = await DevStack().up(all_topics(TopicSettings()))  # started if it was not
    bootstrap = report.addresses.bootstrap_servers
    for records in args.records:
        hops = await tail_hop(bootstrap, records, args.seconds)
        if args.smoke and len(hops) < args.seconds * PINGS_PER_S / 2:
            raise SystemExit(f"smoke: {len(hops)} pings read after {records:,} records")
        if not hops:
            continue
        print(
            f"  {records:6,} records before: {len(hops)} pings, p50 {quantile(hops, 0.5):6.1f} ms, "
            f"p90 {quantile(hops, 0.9):6.1f} ms, p99 {quantile(hops, 0.99):6.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
