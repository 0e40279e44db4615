-- A bulk job may move open runs to another version of their workflow:
-- `migrate` holds what to move them to ({definition, from_version,
-- to_version, map}).
ALTER TABLE bulk_jobs DROP CONSTRAINT bulk_jobs_action_check;
ALTER TABLE bulk_jobs
    ADD CONSTRAINT bulk_jobs_action_check
        CHECK (action IN ('cancel', 'retry', 'pause', 'resume', 'rerun', 'migrate')),
    ADD COLUMN migrate jsonb,
    ADD CONSTRAINT bulk_jobs_migrate_check CHECK ((action = 'migrate') = (migrate IS NOT NULL));
