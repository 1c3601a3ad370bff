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
 * Durations (a scope's retention, lease, verify_settle and remember, and
 * the clock offset) follow the calendar, as timestamptz + interval does with
 * TimeZone = 'UTC': months are added to the UTC date (January 31 + 1 month
 * is February 28), then days, then the time.  A year is 365 or 366 days, not
 * 360.  UTC, not the session's TimeZone, so that a day is always 24 hours
 * and every session and the background worker (whose TimeZone is the
 * server's) find the same instant; the SQL that adds these intervals
 * (alter_scope's rescheduling, check_consistency) writes it as
 * (t AT TIME ZONE 'UTC' + iv) AT TIME ZONE 'UTC', which is the same.
 * Where that statement would fail with "timestamp out of range" the sum is
 * +-infinity instead: a decision must not error.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "common/int.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

char	   *idempo_clock_offset = NULL;	/* the setting's text */
static Interval clock_offset;	/* what it means; zero: none */

/* the same bound as the scope timings (100 years), and beyond any realistic test */
#define MAX_CLOCK_OFFSET_US ((int64) 100 * 365 * USECS_PER_DAY)

/* Adds a fixed duration to a time, saturating at +-infinity. */
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

/*
 * t + iv on the UTC calendar (see the file header): what
 * timestamp_pl_interval() computes on the UTC value, step by step, but
 * saturating at +-infinity (in the direction of the step that left the
 * range) where it would raise an error.  An infinite interval (PostgreSQL
 * 17) gives its infinity, an infinite time stays as it is.
 */
TimestampTz
idempo_time_plus(TimestampTz t, const Interval *iv)
{
	if (TIMESTAMP_NOT_FINITE(t))
		return t;
	if (INTERVAL_IS_NOEND(iv))
		return DT_NOEND;
	if (INTERVAL_IS_NOBEGIN(iv))
		return DT_NOBEGIN;

	if (iv->month != 0 || iv->day != 0)
	{
		struct pg_tm tm;
		fsec_t		fsec;
		int64		julian;

		if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
			return t;			/* cannot happen for a valid finite time */
		if (iv->month != 0)
		{
			/* months since year 0, in 64 bits: no int overflow whatever the interval */
			int64		months = (int64) tm.tm_year * MONTHS_PER_YEAR + (tm.tm_mon - 1) + iv->month;
			int64		year = months >= 0 ? months / MONTHS_PER_YEAR :
				-((-months - 1) / MONTHS_PER_YEAR) - 1;

			if (year < JULIAN_MINYEAR || year > JULIAN_MAXYEAR)
				return iv->month > 0 ? DT_NOEND : DT_NOBEGIN;
			tm.tm_year = (int) year;
			tm.tm_mon = (int) (months - year * MONTHS_PER_YEAR) + 1;
			/* January 31 + 1 month: the last day of February */
			if (tm.tm_mday > day_tab[isleap(tm.tm_year)][tm.tm_mon - 1])
				tm.tm_mday = day_tab[isleap(tm.tm_year)][tm.tm_mon - 1];
		}
		if (iv->day != 0)
		{
			if (!IS_VALID_JULIAN(tm.tm_year, tm.tm_mon, tm.tm_mday))
				return iv->month > 0 ? DT_NOEND : DT_NOBEGIN;
			julian = (int64) date2j(tm.tm_year, tm.tm_mon, tm.tm_mday) + iv->day;
			if (julian < 0 || julian > TIMESTAMP_END_JULIAN)
				return iv->day > 0 ? DT_NOEND : DT_NOBEGIN;
			j2date((int) julian, &tm.tm_year, &tm.tm_mon, &tm.tm_mday);
		}
		if (tm2timestamp(&tm, fsec, NULL, &t) != 0)
			return (iv->day != 0 ? iv->day > 0 : iv->month > 0) ? DT_NOEND : DT_NOBEGIN;
	}
	return idempo_time_add(t, iv->time);
}

TimestampTz
idempo_now(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (clock_offset.month != 0 || clock_offset.day != 0 || clock_offset.time != 0)
		now = idempo_time_plus(now, &clock_offset);
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
	/* the bound as the interval type orders intervals (a month as 30 days) */
	usecs = idempo_interval_usecs(&iv);
	if (usecs > MAX_CLOCK_OFFSET_US || usecs < -MAX_CLOCK_OFFSET_US)
	{
		GUC_check_errdetail("The offset may be at most 100 years either way.");
		return false;
	}
	/* GUC frees this itself: it must come from guc_malloc (src/compat.h before 16) */
	*extra = guc_malloc(LOG, sizeof(Interval));
	if (*extra == NULL)
		return false;
	*(Interval *) *extra = iv;
	return true;
}

void
idempo_clock_offset_assign(const char *newval, void *extra)
{
	clock_offset = *(Interval *) extra;
}

/*
 * An interval as microseconds (day = 24 h, month = 30 days), saturating:
 * how the interval type orders intervals ('1 mon' = '30 days'), for bounds
 * and signs only.  Never to add to a time: that is idempo_time_plus().
 */
int64
idempo_interval_usecs(const Interval *iv)
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

/* An interval as SQL prints it, for messages. */
static char *
interval_text(const Interval *iv)
{
	return DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(iv)));
}

/*
 * Refuses (22023) a lease given to one call -- claim(..., lease),
 * heartbeat(..., extend) -- that the scope's own lease could not be
 * (check_scope()): not positive, a part that runs backwards (it is added to
 * a time part by part, idempo_time_plus()), or not shorter than the scope's
 * retention: unfinished work goes to review when the retention runs out, so
 * a longer lease would never be used.  name and call name the argument and
 * the function in the message.
 */
void
idempo_lease_check(const Interval *iv, const IdempoScope *scope, const char *key,
				   const char *name, const char *call)
{
	Interval	zero;

	memset(&zero, 0, sizeof(zero));
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(iv),
										  IntervalPGetDatum(&zero))) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of the %s of key \"%s\" in scope \"%s\" must be positive, not %s",
						name, call, key, scope->name, interval_text(iv)),
				 errhint("Pass how long this attempt may run before its outcome counts as unknown, or leave %s out for the scope's (%s).",
						 name, interval_text(&scope->lease))));
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(iv),
										  IntervalPGetDatum(&scope->retention))) >= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s %s of the %s of key \"%s\" in scope \"%s\" is not shorter than the scope's retention (%s)",
						name, interval_text(iv), call, key, scope->name, interval_text(&scope->retention)),
				 errhint("Unfinished work goes to review when the retention runs out: a lease that outlives it would never be used.")));
	if (iv->month < 0 || iv->day < 0 || iv->time < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of the %s of key \"%s\" in scope \"%s\" has a part that runs backwards: %s",
						name, call, key, scope->name, interval_text(iv)),
				 errhint("Give no part a negative sign, e.g. '1 day' rather than '1 mon -29 days'.")));
}
