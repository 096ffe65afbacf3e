/* What graph.c, which owns graph and exec handles, lends capture.c: the
 * handle of a graph that a capture ended in, and the settling of graph
 * memory that destroyed execs held. */
#ifndef TP_API_GRAPH_H
#define TP_API_GRAPH_H

#include "api/api.h"

/* The graph a capture ended in (`capture_id`: the capture's, or 0): a new
 * handle in *graph. Where none can be made, the graph is destroyed and the
 * capture's memory goes as a failed capture's. */
tp_error_t tp__graph_made(tp__pgraph *pg, uint64_t capture_id,
                          tp_graph_t *graph);
/* Tells graph memory which destroyed execs' last launches have completed. */
void tp__graph_settle_running(void);

#endif /* TP_API_GRAPH_H */
