/*-------------------------------------------------------------------------
 *
 * clock.c
 *	  idempo's notion of "now", and durations as microseconds.
 *
 * Decisions (is the lease over? has retention passed?) are taken at the
 * moment a function reads the record, from the system clock.  The
 * superuser-only setting idempo.clock_offset shifts that clock, so tests
 * can evaluate a decision "one hour later" deterministically instead of
 * sleeping; it is 0 in production.
 *
 * Durations are fixed lengths: a day is 24 hours and a month 30 days,
 * whatever the session's time zone, so every session and the background
 * worker agree on when something expires.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "common/int.h"
#include "utils/timestamp.h"

int			idempo_clock_offset_s = 0;

/* Adds a duration to a time, saturating at +-infinity. */
TimestampTz
idempo_time_add(TimestampTz t, int64 usecs)
{
	TimestampTz result;

	if (TIMESTAMP_NOT_FINITE(t))
		return t;
	if (pg_add_s64_overflow(t, usecs, &result) || !IS_VALID_TIMESTAMP(result))
		return usecs > 0 ? DT_NOEND : DT_NOBEGIN;
	return result;
}

TimestampTz
idempo_now(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (idempo_clock_offset_s != 0)
		now = idempo_time_add(now, (int64) idempo_clock_offset_s * USECS_PER_SEC);
	return now;
}

/* An interval as microseconds (day = 24 h, month = 30 days), saturating. */
int64
idempo_interval_usecs(Interval *iv)
{
	int64		days_us,
				months_us,
				sum;

	if (pg_mul_s64_overflow((int64) iv->day, USECS_PER_DAY, &days_us) ||
		pg_mul_s64_overflow((int64) iv->month, (int64) DAYS_PER_MONTH * USECS_PER_DAY, &months_us) ||
		pg_add_s64_overflow(iv->time, days_us, &sum) ||
		pg_add_s64_overflow(sum, months_us, &sum))
		return (iv->time < 0 || iv->day < 0 || iv->month < 0) ? PG_INT64_MIN : PG_INT64_MAX;
	return sum;
}

PG_FUNCTION_INFO_V1(idempo_clock_now);

/* idempo.now(): the time idempo decides with (the clock, shifted by idempo.clock_offset). */
Datum
idempo_clock_now(PG_FUNCTION_ARGS)
{
	PG_RETURN_TIMESTAMPTZ(idempo_now());
}
