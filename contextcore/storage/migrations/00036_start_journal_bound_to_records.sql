-- The start journal counts a record only by that record's own content, and the runtime login
-- writes it only through four narrow functions (issue 32, item 7; docs/delivery.md, "A record
-- that kills its process").
--
-- Until now the service role held SELECT, INSERT, UPDATE and DELETE on delivery_starts (00016).
-- A row is keyed by a position (group, topic, partition, offset), and a position exists before
-- its record does: with the runtime credential one could plant rows for a topic's next offsets
-- with a high solo_starts, and each valid record that later arrived there was a suspect that had
-- "already taken its process down" and was dead-lettered as crashed_the_consumer without
-- running. Any future record could be censored that way.
--
-- 1. Every row holds the digest of its record: sha256 over the key and the value, each framed
--    with its length (consumers/runtime/journal.py, record_digest). A start whose digest is not
--    the row's resets the row (starts = 1, solo_starts = 0, the new digest) and counts as a
--    first start. A row written before its record existed cannot hold the digest of bytes
--    nobody had yet (every request carries its client's random 128-bit correlation id), so it
--    can neither make the record a suspect nor count crashes for it. A solo start or finish
--    changes only the row of the same digest.
-- 2. The service role holds no privilege on the table, not even SELECT: it must not learn the
--    digests of the records in flight and then aim rows at them. It reaches the table through
--    the functions below: SECURITY DEFINER (the owner), search_path pinned to pg_catalog then
--    pg_temp (the table named by its schema, as 00006 does), EXECUTE for the service role
--    only, each doing one thing:
--      contextcore_journal_started  count a start of each given record of one topic (position
--                                   and digest); the counts of those rows, which now hold
--                                   those digests, and of no other row
--      contextcore_journal_solo     +1 or -1 solo start of one record, only where the row holds
--                                   its digest
--      contextcore_journal_forget   delete one group's rows of one topic below its committed
--                                   offsets
--      contextcore_journal_prune    delete rows no start touched for a while, a bounded batch
--    A NULL argument is refused, or matches no row and changes nothing. Deleting (forget,
--    prune) or resetting a row (a start with another digest) can only make a record that took
--    its process down run again: the fail-open direction, the one the journal takes anyway
--    when PostgreSQL does not answer. The table's CHECKs still hold every written value.
-- 3. The rows written before this migration have no digest, and are deleted. Giving them a
--    digest that nothing matches would do the same to the counts (the next start of each
--    resets it) and keep rows that only wait for a commit or the sweep. Either way a record in
--    the middle of its crash loop during the upgrade starts its count again: at most
--    max_crashes + 1 more restarts. A member still running the code before this migration
--    loses its grant: its starts fail open (it says not ready) until it is replaced.

LOCK TABLE delivery_starts IN ACCESS EXCLUSIVE MODE;  -- no start lands between the two below
DELETE FROM delivery_starts;
ALTER TABLE delivery_starts
    ADD COLUMN digest bytea NOT NULL CHECK (octet_length(digest) = 32);

REVOKE ALL ON delivery_starts FROM contextcore_app;


-- journal.started: count one start of each record of one topic. A row of the same digest
-- counts one more start; a new row, or one of another digest (reset), is a first start.
-- Returns the counts including this start. At most 10,000 records a call (the runtime sends at
-- most max_in_flight, itself at most 10,000); one record twice in a call is refused
-- (ON CONFLICT cannot change a row twice). The rows are written, so locked, in position order:
-- two batches that share rows (a rebalance) wait for each other instead of deadlocking.
CREATE FUNCTION contextcore_journal_started(
    p_group text, p_topic text, p_partitions integer[], p_offsets bigint[], p_digests bytea[]
)
RETURNS TABLE ("partition" integer, "offset" bigint, starts integer, solo_starts integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_partitions);
BEGIN
    IF (n BETWEEN 0 AND 10000) IS NOT TRUE
        OR cardinality(p_offsets) IS DISTINCT FROM n
        OR cardinality(p_digests) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'a journal start takes up to 10000 positions and as many digests'
            USING ERRCODE = '22023';
    END IF;
    -- a NULL group, topic, position or digest, or a digest that is no sha256, breaks a
    -- NOT NULL or CHECK constraint of the table
    RETURN QUERY
    INSERT INTO public.delivery_starts AS d (consumer_group, topic, "partition", "offset", digest)
    SELECT p_group, p_topic, r.p, r.o, r.g
    FROM unnest(p_partitions, p_offsets, p_digests) AS r(p, o, g)
    ORDER BY r.p, r.o
    ON CONFLICT ON CONSTRAINT delivery_starts_pkey DO UPDATE
    SET starts = CASE WHEN d.digest = EXCLUDED.digest THEN d.starts + 1 ELSE 1 END,
        solo_starts = CASE WHEN d.digest = EXCLUDED.digest THEN d.solo_starts ELSE 0 END,
        digest = EXCLUDED.digest,
        last_started_at = now()
    RETURNING d."partition", d."offset", d.starts, d.solo_starts;
END
$$;

-- journal.solo: a suspect starts alone (+1) or finished alone (-1), on the row of its digest
-- only. A NULL anything but the change matches no row.
CREATE FUNCTION contextcore_journal_solo(
    p_group text, p_topic text, p_partition integer, p_offset bigint, p_digest bytea,
    p_change integer
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (p_change IN (1, -1)) IS NOT TRUE THEN
        RAISE EXCEPTION 'a solo change is 1 or -1, not %', p_change USING ERRCODE = '22023';
    END IF;
    UPDATE public.delivery_starts
    SET solo_starts = greatest(solo_starts + p_change, 0), last_started_at = now()
    WHERE consumer_group = p_group AND topic = p_topic AND "partition" = p_partition
      AND "offset" = p_offset AND digest = p_digest;
END
$$;

-- journal.forget: the records of one group's topic below each committed position will not be
-- delivered to it again. Partitions and positions go in pairs; a NULL matches no row.
CREATE FUNCTION contextcore_journal_forget(
    p_group text, p_topic text, p_partitions integer[], p_committed bigint[]
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(p_partitions) IS DISTINCT FROM cardinality(p_committed) THEN
        RAISE EXCEPTION 'a journal forget takes as many positions as partitions'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM public.delivery_starts AS d
    USING unnest(p_partitions, p_committed) AS c(p, committed)
    WHERE d.consumer_group = p_group AND d.topic = p_topic AND d."partition" = c.p
      AND d."offset" < c.committed;
END
$$;

-- journal.prune (the sweep): rows no start touched for p_older_than (a group or a topic that is
-- gone), at most p_batch of them (1 to 1,000,000); how many went.
CREATE FUNCTION contextcore_journal_prune(p_older_than interval, p_batch integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    removed integer;
BEGIN
    IF (p_batch BETWEEN 1 AND 1000000) IS NOT TRUE THEN
        RAISE EXCEPTION 'prune batch must be 1 to 1000000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    IF (p_older_than > interval '0') IS NOT TRUE THEN
        RAISE EXCEPTION 'prune retention must be positive, not %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM public.delivery_starts
    WHERE ctid IN (
        SELECT ctid FROM public.delivery_starts
        WHERE last_started_at < now() - p_older_than
        LIMIT p_batch
    );
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;

REVOKE EXECUTE ON FUNCTION
    contextcore_journal_started(text, text, integer[], bigint[], bytea[]),
    contextcore_journal_solo(text, text, integer, bigint, bytea, integer),
    contextcore_journal_forget(text, text, integer[], bigint[]),
    contextcore_journal_prune(interval, integer)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    contextcore_journal_started(text, text, integer[], bigint[], bytea[]),
    contextcore_journal_solo(text, text, integer, bigint, bytea, integer),
    contextcore_journal_forget(text, text, integer[], bigint[]),
    contextcore_journal_prune(interval, integer)
TO contextcore_app;
