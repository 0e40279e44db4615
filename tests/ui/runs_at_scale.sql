-- Fills a Composer database with :runs runs of one SUCCEEDED run's shape
-- (and its steps), made over the last few hours: every 50th FAILED, every
-- 97th CANCELLED, tagged customer=0..4999. Used by pages_at_scale.sh.
CREATE TEMP TABLE g AS
  SELECT n, now() - (n * (:span_ms * interval '1 ms')) AS ts FROM generate_series(1, :runs) n;
ALTER TABLE g ADD COLUMN id uuid;
UPDATE g SET id = (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7'
                   || substr(md5(n::text), 1, 3) || '8' || substr(md5(n::text || 'x'), 1, 15))::uuid;
CREATE TEMP TABLE tr AS SELECT * FROM workflow_runs LIMIT 1;
SELECT string_agg(CASE column_name
    WHEN 'id' THEN 'g.id' WHEN 'created_at' THEN 'g.ts' WHEN 'updated_at' THEN 'g.ts'
    WHEN 'finished_at' THEN 'g.ts + interval ''40 ms'''
    WHEN 'status' THEN 'CASE WHEN g.n % 50 = 0 THEN ''FAILED'' WHEN g.n % 97 = 0 THEN ''CANCELLED'' ELSE ''SUCCEEDED'' END'
    WHEN 'error' THEN 'CASE WHEN g.n % 50 = 0 THEN ''node "c" failed: HTTP 502'' END'
    WHEN 'tags' THEN 'jsonb_build_object(''customer'', (g.n % 5000)::text)'
    WHEN 'input' THEN 'jsonb_build_object(''customer'', (g.n % 5000)::text)'
    ELSE 'tr.' || column_name END, ', ' ORDER BY ordinal_position) AS runcols
  FROM information_schema.columns WHERE table_name = 'workflow_runs' AND table_schema = 'public' \gset
INSERT INTO workflow_runs SELECT :runcols FROM g, tr;
CREATE TEMP TABLE tt AS SELECT * FROM task_instances;
SELECT string_agg(CASE column_name
    WHEN 'run_id' THEN 'g.id'
    WHEN 'id' THEN '(substr(g.id::text, 1, 24) || substr(md5(g.n::text || tt.node_id), 1, 12))::uuid'
    WHEN 'created_at' THEN 'g.ts + (tt.created_at - tr.created_at)'
    WHEN 'started_at' THEN 'g.ts + (tt.started_at - tr.created_at)'
    WHEN 'finished_at' THEN 'g.ts + (tt.finished_at - tr.created_at)'
    WHEN 'updated_at' THEN 'g.ts + (tt.updated_at - tr.created_at)'
    ELSE 'tt.' || column_name END, ', ' ORDER BY ordinal_position) AS taskcols
  FROM information_schema.columns WHERE table_name = 'task_instances' AND table_schema = 'public' \gset
INSERT INTO task_instances SELECT :taskcols FROM g, tt, tr;
ANALYZE workflow_runs; ANALYZE task_instances;
SELECT count(*) FROM workflow_runs; SELECT count(*) FROM task_instances;
