/*-------------------------------------------------------------------------
 *
 * clock.c
 *	  idempo's notion of "now", and durations as microseconds.
 *
 * Decisions (is the lease over? has retention passed?) are taken at the
 * moment a function reads the record, from the system clock.  The
 * superuser-only setting idempo.clock_offset shifts that clock, so tests
 * can evaluate a decision "one hour later" deterministically instead of
 * sleeping; it is 0 in production.  It takes an interval ('2 hours',
 * '5min 1s'), like every other duration of idempo.
 *
 * Durations are fixed lengths: a day is 24 hours and a month 30 days,
 * whatever the session's time zone, so every session and the background
 * worker agree on when something expires.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "common/int.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

char	   *idempo_clock_offset = NULL;	/* the setting's text */
static int64 clock_offset_us = 0;	/* what it means */

/* the same bound as the scope timings (100 years), and beyond any realistic test */
#define MAX_CLOCK_OFFSET_US ((int64) 100 * 365 * USECS_PER_DAY)

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

	if (clock_offset_us != 0)
		now = idempo_time_add(now, clock_offset_us);
	return now;
}

/*
 * Check hook of idempo.clock_offset: anything the interval type accepts
 * ('90', '2 hours', '5min 1s', '-1 day', 'PT2H'), a bare number being
 * seconds as before.  Parsed with the interval type's own routines, which
 * report errors as codes (a check hook must not throw).
 */
bool
idempo_clock_offset_check(char **newval, void **extra, GucSource source)
{
	char	   *field[MAXDATEFIELDS];
	int			ftype[MAXDATEFIELDS];
	char		workbuf[256];
	char	   *copy;
	int			nf;
	int			dtype = 0;
	int			dterr;
	struct pg_itm_in itm;
	Interval	iv;
	int64		usecs;

	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("Give an interval, such as '6 minutes', '-2 hours' or '90' (seconds).");
		return false;
	}
	memset(&itm, 0, sizeof(itm));
	dterr = ParseDateTime(*newval, workbuf, sizeof(workbuf), field, ftype, MAXDATEFIELDS, &nf);
	if (dterr == 0)
		dterr = DecodeInterval(field, ftype, nf, INTERVAL_FULL_RANGE, &dtype, &itm);
	if (dterr == DTERR_BAD_FORMAT)
	{
		copy = pstrdup(*newval);
		memset(&itm, 0, sizeof(itm));
		dterr = DecodeISO8601Interval(copy, &dtype, &itm);
	}
	if (dterr != 0 || dtype != DTK_DELTA || itmin2interval(&itm, &iv) != 0)
	{
		GUC_check_errdetail("\"%s\" is not an interval; give one such as '6 minutes', '-2 hours' or '90' (seconds).",
							*newval);
		return false;
	}
	usecs = idempo_interval_usecs(&iv);
	if (usecs > MAX_CLOCK_OFFSET_US || usecs < -MAX_CLOCK_OFFSET_US)
	{
		GUC_check_errdetail("The offset may be at most 100 years either way.");
		return false;
	}
	/* GUC frees this itself: it must come from guc_malloc (src/compat.h before 16) */
	*extra = guc_malloc(LOG, sizeof(int64));
	if (*extra == NULL)
		return false;
	*(int64 *) *extra = usecs;
	return true;
}

void
idempo_clock_offset_assign(const char *newval, void *extra)
{
	clock_offset_us = *(int64 *) extra;
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
