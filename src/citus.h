/*-------------------------------------------------------------------------
 *
 * citus.h
 *	  What idempo does differently when its tables are distributed with
 *	  Citus (citus.c).  Single-node idempo never takes these paths.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_CITUS_H
#define IDEMPO_CITUS_H

#include "idempo.h"

/* One shard placement of idempo.operations on this node, and its co-located reviews shard. */
typedef struct IdempoCitusShard
{
	int64		shard_id;
	char	   *operations;		/* quoted, schema-qualified shard relation names */
	char	   *reviews;
} IdempoCitusShard;

extern bool idempo_citus_distributed(void);
extern List *idempo_citus_local_shards(void);
extern int	idempo_citus_sweep_execute(const IdempoCitusShard *shard, IdempoPlanId id,
									   Datum *args);

#endif							/* IDEMPO_CITUS_H */
