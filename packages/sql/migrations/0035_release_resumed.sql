-- 0035: a resumed attempt given back unstarted keeps its resume (issue 21, capabilities.md §17,
-- docs/adr/0030-callbacks.md, amendment 2026-12-02).
--
-- A parked attempt that a resume reached is taken back by a worker (claim_resumed: callback
-- fields cleared, callback_result kept) and waits in that worker's buffer. A worker that stops
-- before starting it gave it back as a snooze, which closed the attempt: its attempt_state row,
-- and with it the resume payload, was deleted, and the job ran again from the start waiting for a
-- callback that had already come (a lost resume on every rolling deploy that caught one).
--
-- release_resumed(job, lease) -> true when the attempt is parked again as resumed: another
-- worker's claim_resumed takes it, with its payload, and the same run lease. False when the
-- attempt is closed (rescued, cancelled) or is not a taken-back resumed attempt; then nothing is
-- written.
--
-- Locks: the attempt's claims row (lock_attempt), as every callback write. Writes:
-- attempt_state (callback_waiting, callback_state, heartbeat_at: the stale sweep's clock restarts
-- now, as on a resume). Notifies 'resumed:<job>:<lease>:<queue>' on the cancel channel so the
-- queue's dispatchers in other processes take it back at once.
CREATE FUNCTION :AWA_SCHEMA.release_resumed(p_job_id bigint, p_run_lease bigint)
RETURNS boolean
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'release_resumed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN false;
  END IF;
  -- taken back by claim_resumed: parked once, no longer waiting, no callback registered since
  UPDATE attempt_state a SET callback_waiting = true, callback_state = 'resumed', heartbeat_at = now()
  WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease
    AND a.parked_at IS NOT NULL AND NOT a.callback_waiting AND a.callback_state IS NULL AND a.callback_id IS NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', 'resumed:' || p_job_id || ':' || p_run_lease || ':' || c.queue)
  FROM claims c WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease;
  RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.release_resumed(bigint, bigint) FROM PUBLIC;
