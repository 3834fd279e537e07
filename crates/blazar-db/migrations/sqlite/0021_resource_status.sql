-- Why a floating IP or network segment is not reservable when the monitor took it out:
-- `taken` while something outside blazar-rs holds it in the cloud. NULL otherwise (an
-- operator's own choice), so the monitor puts back only what it took out.
ALTER TABLE resources ADD COLUMN status TEXT;
