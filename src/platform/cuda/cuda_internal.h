/* The cuda platform's ops, each declared for cuda_platform.c's table and
 * defined in the file that owns it; the driver access they share is
 * cuda_driver.h's. Only src/platform/cuda/ includes it. */
#ifndef TP_CUDA_INTERNAL_H
#define TP_CUDA_INTERNAL_H

#include "platform/cuda/cuda_driver.h"

/* The ops, in the files that own them. */
tp_error_t tp__cu_init(void);
tp_error_t tp__cu_device_count_op(int *count);
tp_error_t tp__cu_device_attribute(int *value, tp_device_attr_t attr,
                                   int device);
tp_error_t tp__cu_set_device(int device);

tp_error_t tp__cu_stream_create(int device, unsigned flags, tp__pstream **ps,
                                tp_stream_t *handle, uint64_t *uid);
tp_error_t tp__cu_stream_destroy(tp__pstream *ps);
tp_error_t tp__cu_stream_legacy(int device, tp__stream_desc *desc);
tp_error_t tp__cu_stream_adopt(tp_stream_t handle, tp__stream_desc *desc);
tp_error_t tp__cu_stream_identify(tp_stream_t handle, bool ask_capture,
                                  uint64_t *uid, tp_capture_status_t *status);
tp_error_t tp__cu_stream_synchronize(tp__pstream *ps);
tp_error_t tp__cu_stream_query(tp__pstream *ps);
tp_error_t tp__cu_stream_poll(tp__pstream *ps);
bool tp__cu_stream_named(tp__pstream *ps, uint64_t uid);
tp_error_t tp__cu_stream_wait_event(tp__pstream *ps, tp__pevent *ev);
tp_error_t tp__cu_memset_async(tp__pstream *ps, void *ptr, int value,
                               size_t size);
tp_error_t tp__cu_memcpy_async(tp__pstream *ps, void *dst, const void *src,
                               size_t size);
tp_error_t tp__cu_launch_host_func(tp__pstream *ps, void (*fn)(void *),
                                   void *arg);
tp_error_t tp__cu_device_synchronize(int device);

tp_error_t tp__cu_event_create(int device, tp__pevent **ev);
tp_error_t tp__cu_event_destroy(tp__pevent *ev);
tp_error_t tp__cu_event_record(tp__pevent *ev, tp__pstream *ps);
tp_error_t tp__cu_event_query(tp__pevent *ev);
tp_error_t tp__cu_event_synchronize(tp__pevent *ev);
tp_error_t tp__cu_event_wait(tp__pevent *ev);

tp_error_t tp__cu_mem_query(const tp__mem_kind *kind, size_t *granularity,
                            uint64_t *capacity);
tp_error_t tp__cu_reserve(const tp__mem_kind *kind, size_t size, size_t align,
                          tp__pres **res, uintptr_t *base);
tp_error_t tp__cu_unreserve(tp__pres *res);
tp_error_t tp__cu_chunk_create(tp__pres *res, tp__phys *phys);
tp_error_t tp__cu_chunk_release(tp__pres *res, tp__phys phys);
tp_error_t tp__cu_map(tp__pres *res, size_t offset, const tp__phys *phys,
                      size_t n);
tp_error_t tp__cu_unmap(tp__pres *res, size_t offset, size_t n);
tp_error_t tp__cu_set_access(tp__pres *res, size_t offset, size_t size,
                             const tp_access_desc_t *list, size_t count);
tp_error_t tp__cu_share_reservation(tp__pres *res, int *fd);
tp_error_t tp__cu_share_chunk(tp__pres *res, tp__phys phys,
                              tp__chunk_share *share);
tp_error_t tp__cu_reserve_imported(const tp__mem_kind *kind, size_t size,
                                   size_t align, int fd, tp__pres **res,
                                   uintptr_t *base);
tp_error_t tp__cu_chunk_import(tp__pres *res, const tp__chunk_share *share,
                               tp__phys *phys);
tp_error_t tp__cu_device_uuid(int device, unsigned char uuid[16]);

/* cuEventRecord for the core's markers, which must mark real work: on a
 * stream that captures (or the legacy stream while a capture forbids it),
 * it records nothing and fails, leaving the capture as it was. */
CUresult tp__cu_record_uncaptured(CUevent ev, CUstream s);

tp_error_t tp__cu_capture_begin(tp__pstream *ps, tp_capture_mode_t mode);
tp_error_t tp__cu_capture_end(tp__pstream *ps, tp__pgraph **graph,
                              uint64_t *id);
tp_error_t tp__cu_capture_status(tp__pstream *ps, tp_capture_status_t *status,
                                 uint64_t *id);
tp_error_t tp__cu_capture_invalidate(tp__pstream *ps);
tp_error_t tp__cu_capture_point(tp__pstream *ps, uint64_t id, tp__pnode *node);
tp_error_t tp__cu_capture_follows(tp__pstream *ps, const tp__pnode *nodes,
                                  size_t n, unsigned char *out);
tp_error_t tp__cu_capture_attach(tp__pstream *ps, uint64_t id,
                                 void (*release)(void *), void *arg, void **tie,
                                 tp__pgraph **graph);
tp_error_t tp__cu_capture_detach(tp__pgraph *graph, void *tie);
tp_error_t tp__cu_capture_event_record(tp__pevent *ev, tp__pstream *ps);
tp_error_t tp__cu_capture_event_wait(tp__pstream *ps, tp__pevent *ev);
tp_error_t tp__cu_graph_instantiate(tp__pgraph *graph, unsigned long long flags,
                                    void (*release)(void *), void *arg,
                                    tp__pexec **exec);
tp_error_t tp__cu_graph_launch(tp__pexec *exec, tp__pstream *ps);
tp_error_t tp__cu_graph_exec_destroy(tp__pexec *exec);
tp_error_t tp__cu_graph_destroy(tp__pgraph *graph);

#endif /* TP_CUDA_INTERNAL_H */
