-- soak: resolve the oldest open review and the oldest open conflict.
SELECT soak_review();
