-- 0004: operator actions on jobs by unique key.

-- cancel_by_unique_key(key hex, reason) -> the cancelled job's id, or NULL when no live job holds
-- the key (nobody holds it, or its holder is already terminal, e.g. a completed job whose key is
-- still held by its history).
-- Locks: those of cancel_job (per-job lock, then per representation).
CREATE FUNCTION :AWA_SCHEMA.cancel_by_unique_key(p_key text, p_reason text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_job_id bigint;
BEGIN
  SELECT u.job_id INTO v_job_id FROM unique_claims u WHERE u.unique_key = decode(p_key, 'hex');
  IF v_job_id IS NULL THEN
    RETURN NULL;
  END IF;
  IF cancel_job(v_job_id, p_reason) = 'cancelled' THEN
    RETURN v_job_id;
  END IF;
  RETURN NULL;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cancel_by_unique_key(text, text) FROM PUBLIC;
