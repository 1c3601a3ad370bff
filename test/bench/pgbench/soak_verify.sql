-- soak: settle the oldest unknown attempt (verify).
SELECT soak_verify();
