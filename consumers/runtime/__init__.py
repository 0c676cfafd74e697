"""The delivery runtime every consumer runs on.

One record, exactly one outcome: a reply, a dead letter, or a bounded retry (then a dead
letter); never an exception into the fetch loop, never a partition that stops moving. Many records
are in flight at once, commits never pass an unfinished record of a partition, and shutdown
drains what is in flight. ``docs/delivery.md`` explains every choice.

    records.py   the record as handlers see it, the outcomes, the retry headers   (pure)
    tracker.py   per-partition in-flight offsets and the commit position          (pure)
    letters.py   bounded dead-letter records                                       (pure)
    transport.py the ports: transport, record source, rebalance, publisher, committer, handler
    delivery.py  one consumer's delivery, composed of:
      window.py    slots, per-organization lanes, the read ahead, the screen, drains
      pipeline.py  one record: back-off, the start journal and the solo gate, the handler
      replies.py   a reply published, or its fallback
      retries.py   retry copies, dead letters, farewells
      commits.py   commit positions, committed in the background
      monitor.py   liveness, ages and lags from snapshots
    kafka.py     their aiokafka adapters: transport, source, publisher, committer
    inmemory.py  their in-memory adapters: a broker of this process (the behaviour suites)
    health.py    /metrics, /healthz (a stuck partition is not live), /readyz
    tracing.py   each record's span, continuing its caller's trace; OTLP export on demand
    logs.py      JSON log lines naming the record, its correlation id and its trace
    metrics.py   the runtime's Prometheus series
    app.py       a consumer's process: the fetch loop, the lifecycle, wired to the above
"""
