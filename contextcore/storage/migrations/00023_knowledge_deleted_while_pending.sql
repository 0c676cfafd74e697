-- An uploader whose document is deleted after its chunks went to the embedding group is told
-- (issue 18; docs/knowledge.md).
--
-- A delete while the upload consumer still extracts is answered by that consumer ("the
-- document was deleted"). Once the batches are on the embed topic, the upload consumer is done
-- and each batch finds no source: nobody answered, and the uploader waited for its timeout.
-- The deletion record now keeps the reply address and generation of a source deleted while
-- pending (never of one that was ready: nobody waits on it), and the first batch that finds
-- its source gone answers that address, read in the batch's own scope under row security (the
-- processed-message ledger keeps the later batches, and redeliveries, from answering again).

-- As the source's columns are (no bound of their own here: a record that failed a check would
-- refuse the delete that writes it).
ALTER TABLE knowledge_deletions
    ADD COLUMN reply_to text, ADD COLUMN correlation_id text, ADD COLUMN generation integer;
-- a batch finds its source's record by the source id alone
CREATE INDEX knowledge_deletions_source_idx ON knowledge_deletions (source_id);

-- 00021's function, recording the pending source's reply address too.
CREATE OR REPLACE FUNCTION knowledge_record_deletion() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN OLD;
    END IF;
    INSERT INTO public.knowledge_deletions
        (organization_id, source_id, title, identity, chunks, requested_by, reply_to,
         correlation_id, generation)
    VALUES (
        OLD.organization_id, OLD.id, OLD.title, coalesce(OLD.uri, OLD.object_key),
        (SELECT count(*) FROM public.knowledge_chunks c WHERE c.source_id = OLD.id),
        nullif(left(btrim(coalesce(current_setting('contextcore.requested_by', true), '')), 200),
               ''),
        CASE WHEN OLD.status = 'pending' THEN OLD.reply_to END,
        CASE WHEN OLD.status = 'pending' THEN OLD.correlation_id END,
        CASE WHEN OLD.status = 'pending' THEN OLD.generation END);
    RETURN OLD;
END
$$;
