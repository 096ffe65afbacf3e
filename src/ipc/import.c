/* The importing side of src/ipc/: a pool that stands for another process's
 * pool. Its range in this process maps the exporter's chunks as imported
 * pointers need them and unmaps them once no import uses them; its frees
 * give the exporter's holds back in stream order. Every wait on the
 * exporter ends at a deadline (wire.h), and everything the exporter says is
 * bounded before it is used. The channel, the state's locks and the list
 * of imported pools are channel.h's. */
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/channel.h"

static void import_free_state(tp__ipc_import *m) {
  if (m->res)
    (void)tp__platform->unreserve(m->res);
  if (m->fd >= 0)
    tp__ipc_fd_close(m->fd);
  for (size_t i = 0; m->pages && i < m->npages; i++)
    free(m->pages[i]);
  free(m->pages);
  free(m->stale);
  free(m->ptrs);
  free(m->done);
  free(m->unsent);
  pthread_mutex_destroy(&m->talk_mu);
  pthread_mutex_destroy(&m->mu);
  pthread_mutex_destroy(&m->rel_mu);
  pthread_cond_destroy(&m->rel_cv);
  free(m);
}

/* ---- the chunk table ---------------------------------------------------- */

/* Chunk c's slot, or NULL where its page was never made; mu held. */
static slot *slot_of(const tp__ipc_import *m, size_t c) {
  slot *page = m->pages[c >> SLOT_PAGE_SHIFT];
  return page ? &page[c & (SLOT_PAGE - 1)] : NULL;
}

/* As slot_of, making the page; NULL when memory is short. mu held. */
static slot *slot_make(tp__ipc_import *m, size_t c) {
  slot **page = &m->pages[c >> SLOT_PAGE_SHIFT];
  if (!*page)
    *page = calloc(SLOT_PAGE, sizeof **page);
  return *page ? &(*page)[c & (SLOT_PAGE - 1)] : NULL;
}

/* ---- mappings ----------------------------------------------------------- */

/* Access of this process's locations to a newly mapped chunk: the host's
 * for host memory, and every device the pool grants. mu held. */
static tp_error_t import_access(tp__pool *p, size_t offset, size_t size) {
  tp_access_desc_t list[TP_MAX_DEVICES + 1];
  size_t n = 0;
  if (p->imp->host_pool)
    list[n++] = (tp_access_desc_t){p->props.location, TP_ACCESS_READ_WRITE};
  for (int d = 0; d < TP_MAX_DEVICES; d++)
    if (p->space.access[d] != TP_ACCESS_NONE)
      list[n++] =
          (tp_access_desc_t){{TP_LOCATION_DEVICE, d, 0}, p->space.access[d]};
  return n ? tp__platform->set_access(p->imp->res, offset, size, list, n)
           : TP_SUCCESS;
}

/* One chunk mapped (`delta` > 0) or unmapped: the reserved bytes and the
 * pool's map and unmap counts, as the core keeps them for its own chunks. */
static void reserved_move(tp__pool *p, int64_t delta) {
  uint64_t r =
      atomic_fetch_add(&p->space.reserved, (uint64_t)delta) + (uint64_t)delta;
  atomic_fetch_add_explicit(delta > 0 ? &p->space.maps : &p->space.unmaps, 1,
                            memory_order_relaxed);
  if (delta > 0)
    tp__atomic_max(&p->space.reserved_high, r);
}

/* Unmaps chunk c, which is mapped; mu held. A chunk the platform would not
 * unmap stays recorded, and is tried again before it is used again. */
static tp_error_t chunk_drop(tp__pool *p, size_t c) {
  tp__ipc_import *m = p->imp;
  slot *s = slot_of(m, c);
  TP_FORWARD(tp__platform->unmap(m->res, c * m->gran, 1));
  (void)tp__platform->chunk_release(m->res, s->phys);
  s->phys = 0;
  reserved_move(p, -(int64_t)m->gran);
  return TP_SUCCESS;
}

/* Takes the releases reported so far out of the chunks' counts. A chunk
 * that no import uses any more is listed stale, to be unmapped once rel_mu
 * is let go (no driver call under it). mu and rel_mu held. */
static void count_released(tp__ipc_import *m) {
  for (uint32_t i = 0; i < m->ndone; i++) {
    size_t c0 = m->done[i].offset / m->gran;
    size_t c1 = (m->done[i].offset + m->done[i].size - 1) / m->gran;
    /* A count falls to 0 once per call, and only a counted chunk's: the
     * list, emptied after every call, has room. */
    for (size_t c = c0; c <= c1; c++) {
      slot *s = slot_of(m, c);
      if (s && s->refs && --s->refs == 0) {
        m->stale[m->nstale++] = c;
        m->nheld--;
      }
    }
  }
  m->ndone = 0;
}

/* Unmaps the stale chunks; mu held. One the platform would not unmap stays
 * mapped with no count, and is unmapped before it is mapped again. */
static void drop_stale(tp__pool *p) {
  tp__ipc_import *m = p->imp;
  for (size_t i = 0; i < m->nstale; i++) {
    const slot *s = slot_of(m, m->stale[i]);
    if (!s->refs && s->phys)
      (void)chunk_drop(p, m->stale[i]);
  }
  m->nstale = 0;
}

/* Room in `done` for every release in flight and one more, so that a host
 * function never fails to report one; rel_mu held. */
static bool done_reserve(tp__ipc_import *m) {
  uint32_t need = m->ndone + m->pending + 1;
  if (need <= m->capdone)
    return true;
  uint32_t cap = m->capdone ? m->capdone : 16;
  while (cap < need)
    cap *= 2;
  span *v = realloc(m->done, cap * sizeof *v);
  if (!v)
    return false;
  m->done = v;
  m->capdone = cap;
  return true;
}

/* Room in `stale` for one more counted chunk; mu held. */
static bool stale_reserve(tp__ipc_import *m) {
  if (m->nheld + 1 <= m->capstale)
    return true;
  size_t cap = m->capstale ? 2 * m->capstale : 16;
  size_t *v = realloc(m->stale, cap * sizeof *v);
  if (!v)
    return false;
  m->stale = v;
  m->capstale = cap;
  return true;
}

/* A free's host function ran, or will never run; rel_mu held. */
static void pending_done(tp__ipc_import *m) {
  if (--m->pending == 0)
    pthread_cond_broadcast(&m->rel_cv);
}

/* Gives one hold back: reports the release for the chunks' counts, then
 * tells the exporter. Runs as a host function on the freeing stream once
 * the stream reaches the free, or inline where none could be queued. */
static void release_run(tp__ipc_import *m, uint64_t offset, uint64_t size) {
  pthread_mutex_lock(&m->rel_mu);
  /* Reported before it is sent, so that an import that sees the exporter's
   * state after this release also sees the release (import_pointer). The
   * room was made by the free. */
  m->done[m->ndone++] = (span){offset, size};
  tp__chan_release(m, offset);
  pending_done(m);
  pthread_mutex_unlock(&m->rel_mu);
}

typedef struct release_job {
  tp__ipc_import *m;
  uint64_t offset, size;
} release_job;

static void release_fn(void *arg) {
  release_job *j = arg;
  release_run(j->m, j->offset, j->size);
  free(j);
}

static uint32_t ptr_index(const tp__ipc_import *m, uint64_t offset) {
  uint32_t lo = 0, hi = m->nptrs;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m->ptrs[mid].offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Asks the exporter for chunk c, which the channel holds a block in, and
 * maps it with this process's access; mu held. */
static tp_error_t map_one(tp__pool *p, size_t c) {
  tp__ipc_import *m = p->imp;
  slot *s = slot_make(m, c);
  TP_RETURN_IF(!s || !stale_reserve(m), TP_ERROR_OUT_OF_MEMORY);
  if (s->phys) /* left from before a gap in the holds: stale */
    TP_FORWARD(chunk_drop(p, c));
  tp__wire q = tp__wire_make(TP_OP_CHUNK), a;
  q.offset = c;
  TP_FORWARD(tp__chan_request(m, &q, NULL));
  int fd = -1;
  TP_FORWARD(tp__chan_reply(m, TP_OP_CHUNK_INFO, &a, &fd));
  /* Where the chunk lies in the exporter's backing: a chunk's place, and
   * the exporter holds no more chunks than a quarter of its range (its
   * size limit), so a place past the range is a lie. */
  tp_error_t err = tp__wire_status(a.status, false);
  if (err == TP_SUCCESS && (a.offset % m->gran || a.offset >= m->va_size))
    err = TP_ERROR_INVALID_VALUE;
  if (err != TP_SUCCESS && fd >= 0)
    close(fd);
  TP_FORWARD(err);
  tp__chunk_share share = {a.offset, fd};
  tp__phys phys = 0;
  TP_FORWARD(tp__platform->chunk_import(m->res, &share, &phys));
  err = tp__platform->map(m->res, c * m->gran, &phys, 1);
  if (err != TP_SUCCESS) {
    (void)tp__platform->chunk_release(m->res, phys);
    return err;
  }
  s->phys = phys;
  reserved_move(p, (int64_t)m->gran);
  err = import_access(p, c * m->gran, m->gran);
  if (err != TP_SUCCESS) {
    (void)chunk_drop(p, c);
    return err;
  }
  s->refs = 1;
  m->nheld++;
  return TP_SUCCESS;
}

/* Maps the chunks under [offset, offset + size), which the channel holds,
 * and counts the import in each; mu held. */
static tp_error_t map_range(tp__pool *p, uint64_t offset, uint64_t size) {
  tp__ipc_import *m = p->imp;
  size_t c0 = offset / m->gran, c1 = (offset + size - 1) / m->gran;
  tp_error_t err = TP_SUCCESS;
  size_t c = c0;
  for (; c <= c1 && err == TP_SUCCESS; c++) {
    /* Counted already: a hold has kept it in place since it was mapped. */
    slot *s = slot_of(m, c);
    if (s && s->refs)
      s->refs++;
    else
      err = map_one(p, c);
  }
  if (err == TP_SUCCESS)
    return TP_SUCCESS;
  /* c went one past the chunk that failed: undo the counts before it. */
  for (size_t k = c0; k + 1 < c; k++) {
    slot *s = slot_of(m, k);
    if (--s->refs == 0) {
      m->nheld--;
      (void)chunk_drop(p, k);
    }
  }
  return err;
}

/* ---- pointers -------------------------------------------------------------
 */

tp_error_t tp__ipc_import_pointer(tp__pool *p,
                                  const tp_pool_ptr_export_data_t *data,
                                  void **ptr) {
  tp__ipc_import *m = p->imp;
  tp__ipc_record r;
  memcpy(&r, data, sizeof r);
  /* A record of another pool or process, or an impossible one, is refused
   * here; the exporter checks the rest. */
  TP_RETURN_IF(!tp__ipc_record_sane(&r, m->va_size) || r.pid != m->pid ||
                   r.serial != m->serial,
               TP_ERROR_INVALID_VALUE);
  tp__wire q = tp__wire_make(TP_OP_IMPORT), a;
  memcpy(q.data, &r, sizeof r);
  pthread_mutex_lock(&m->talk_mu);
  pthread_mutex_lock(&m->mu);
  if (m->dead) {
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_unlock(&m->talk_mu);
    return TP_ERROR_INVALID_VALUE;
  }
  /* The releases reported so far are taken, and the request sent, in one
   * stretch of rel_mu, and a host function reports a release and sends it
   * in one stretch too. So every release the exporter sees before this
   * import is in `done`, and a chunk still counted after it was held by the
   * exporter without a gap since it was mapped: its mapping is good. A
   * chunk whose count falls to zero is unmapped before the reply is read,
   * and mapped afresh if this import needs it. */
  tp__chan_drain_late(m);
  tp_error_t err = tp__chan_request(m, &q, count_released);
  drop_stale(p);
  int fd = -1;
  if (err == TP_SUCCESS)
    err = tp__chan_reply(m, TP_OP_IMPORTED, &a, &fd);
  if (fd >= 0)
    close(fd);
  if (err == TP_SUCCESS)
    err = tp__wire_status(a.status, false);
  if (err == TP_SUCCESS && (a.offset != r.offset || a.size != r.size))
    err = TP_ERROR_INVALID_VALUE;
  bool held = err == TP_SUCCESS;
  if (err == TP_SUCCESS && !TP_ARRAY_ROOM(m->ptrs, m->nptrs, m->capptrs))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS)
    err = map_range(p, r.offset, r.size);
  /* Looked up after the mapping, which lets mu go while it waits: a free
   * of this pointer may have changed the table meanwhile. */
  uint32_t i = ptr_index(m, r.offset);
  bool known = i < m->nptrs && m->ptrs[i].offset == r.offset;
  if (err == TP_SUCCESS && known) {
    m->ptrs[i].count++;
  } else if (err == TP_SUCCESS) {
    memmove(&m->ptrs[i + 1], &m->ptrs[i], (m->nptrs - i) * sizeof *m->ptrs);
    m->ptrs[i] = (imported){r.offset, r.size, 1};
    m->nptrs++;
  }
  if (err != TP_SUCCESS && held) {
    /* Give back the hold the exporter recorded. */
    pthread_mutex_lock(&m->rel_mu);
    tp__chan_release(m, r.offset);
    pthread_mutex_unlock(&m->rel_mu);
  }
  /* An allocation imported again is the same bytes: counted once. */
  if (err == TP_SUCCESS && !known) {
    int64_t used =
        atomic_fetch_add(&p->caches.base, (int64_t)r.size) + (int64_t)r.size;
    tp__atomic_max(&p->used_high, (uint64_t)used);
  }
  pthread_mutex_unlock(&m->mu);
  pthread_mutex_unlock(&m->talk_mu);
  TP_FORWARD(err);
  *ptr = (void *)(p->space.base + r.offset);
  return TP_SUCCESS;
}

static tp_error_t import_free(tp__pool *p, uintptr_t addr, tp__stream *s,
                              bool *kept) {
  *kept = true; /* an imported pointer is never the core's to free */
  tp__ipc_import *m = p->imp;
  uint64_t offset = (uint64_t)(addr - p->space.base);
  pthread_mutex_lock(&m->mu);
  if (m->dead) {
    pthread_mutex_unlock(&m->mu);
    return TP_ERROR_INVALID_VALUE;
  }
  uint32_t i = ptr_index(m, offset);
  bool known = i < m->nptrs && m->ptrs[i].offset == offset;
  pthread_mutex_lock(&m->rel_mu);
  bool room = known && done_reserve(m);
  if (room)
    m->pending++;
  pthread_mutex_unlock(&m->rel_mu);
  if (!room) {
    pthread_mutex_unlock(&m->mu);
    /* Not an imported pointer (or freed already), or no memory. */
    return known ? TP_ERROR_OUT_OF_MEMORY : TP_ERROR_INVALID_VALUE;
  }
  uint64_t size = m->ptrs[i].size;
  /* The hold goes when the stream reaches the free, not before: work
   * queued ahead of it may still use the memory. No other thread sees the
   * tables before mu is let go, so they change once the free stands. */
  release_job *j = malloc(sizeof *j);
  tp_error_t err = TP_ERROR_OUT_OF_MEMORY;
  if (j) {
    *j = (release_job){m, offset, size};
    err = tp__platform->launch_host_func(s->ps, release_fn, j);
  }
  if (err != TP_SUCCESS) {
    /* No host function: wait for the stream here instead; where even
     * that fails, the free is refused and nothing changes. */
    free(j);
    err = tp__platform->stream_synchronize(s->ps);
    if (tp__pevent_finished(err)) {
      release_run(m, offset, size);
      err = TP_SUCCESS;
    } else {
      pthread_mutex_lock(&m->rel_mu);
      pending_done(m);
      pthread_mutex_unlock(&m->rel_mu);
      pthread_mutex_unlock(&m->mu);
      return err;
    }
  }
  if (--m->ptrs[i].count == 0) {
    memmove(&m->ptrs[i], &m->ptrs[i + 1], (m->nptrs - i - 1) * sizeof *m->ptrs);
    m->nptrs--;
    atomic_fetch_sub(&p->caches.base, (int64_t)size);
  }
  pthread_mutex_unlock(&m->mu);
  return TP_SUCCESS;
}

/* ---- settling, access, destruction ----------------------------------------
 */

/* Unmaps what no import uses any more, reads a late reply, and sends the
 * releases that had to wait; mu held. */
static void import_settle(tp__pool *p) {
  tp__chan_drain_late(p->imp);
  pthread_mutex_lock(&p->imp->rel_mu);
  count_released(p->imp);
  tp__chan_flush(p->imp);
  pthread_mutex_unlock(&p->imp->rel_mu);
  drop_stale(p);
}

static void import_trim(tp__pool *p) {
  pthread_mutex_lock(&p->imp->mu);
  if (!p->imp->dead)
    import_settle(p);
  pthread_mutex_unlock(&p->imp->mu);
}

void tp__ipc_settle(void) {
  tp__importers_settle(import_settle);
}

static tp_error_t import_set_access(tp__pool *p, const tp_access_desc_t *list,
                                    size_t n) {
  tp__ipc_import *m = p->imp;
  /* A conversation's mapping reads the access set here: not meanwhile. */
  pthread_mutex_lock(&m->talk_mu);
  pthread_mutex_lock(&m->mu);
  tp_error_t err = m->dead ? TP_ERROR_INVALID_VALUE : TP_SUCCESS;
  for (size_t c = 0; c < m->nchunks && err == TP_SUCCESS; c++) {
    const slot *s = slot_of(m, c);
    if (!s) /* a page never mapped: skip it whole */
      c |= SLOT_PAGE - 1;
    else if (s->phys)
      err = tp__platform->set_access(m->res, c * m->gran, m->gran, list, n);
  }
  tp__mutex_lock(&p->lock);
  for (size_t i = 0; err == TP_SUCCESS && i < n; i++)
    p->space.access[list[i].location.id] = list[i].flags;
  tp__mutex_unlock(&p->lock);
  pthread_mutex_unlock(&m->mu);
  pthread_mutex_unlock(&m->talk_mu);
  return err;
}

static void import_destroy(tp__pool *p) {
  tp__ipc_import *m = p->imp;
  if (!m)
    return;
  tp__importers_remove(p);
  pthread_mutex_lock(&m->talk_mu);
  pthread_mutex_lock(&m->mu);
  m->dead = true;
  /* Frees still queued on streams report to this state: wait for them. */
  pthread_mutex_lock(&m->rel_mu);
  while (m->pending)
    pthread_cond_wait(&m->rel_cv, &m->rel_mu);
  pthread_mutex_unlock(&m->rel_mu);
  import_settle(p);
  /* Pointers never freed, and chunks the platform would not unmap before:
   * closing the channel releases the holds. */
  for (size_t c = 0; c < m->nchunks; c++) {
    const slot *s = slot_of(m, c);
    if (!s)
      c |= SLOT_PAGE - 1;
    else if (s->phys)
      (void)chunk_drop(p, c);
  }
  /* The exporter sees the channel close and lets go of what this process
   * still held; the range goes too, as no call maps into it any more. */
  tp__chan_break(m);
  /* The address table lets go of the range before the platform does: a
   * pool imported meanwhile may be given the same range, and a late removal
   * would take its entry instead. */
  if (m->registered)
    tp__registry_remove(p->space.base, p->space.va_size);
  m->registered = false;
  if (m->res)
    (void)tp__platform->unreserve(m->res);
  m->res = NULL;
  pthread_mutex_unlock(&m->mu);
  pthread_mutex_unlock(&m->talk_mu);
}

static void import_fini(tp__pool *p) {
  if (p->imp)
    import_free_state(p->imp);
  p->imp = NULL;
}

/* ---- importing a pool ------------------------------------------------------
 */

/* Connects to the exporter over the rendezvous `fd` and reads its HELLO
 * into *h, with the backing descriptor in *backing; *chan is the private
 * channel. Both waits end at one deadline. */
static tp_error_t import_connect(int fd, int *chan, tp__wire *h, int *backing) {
  int type = 0;
  socklen_t len = sizeof type;
  TP_RETURN_IF(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
                   type != SOCK_SEQPACKET,
               TP_ERROR_INVALID_VALUE);
  int sv[2];
  TP_FORWARD(tp__ipc_socketpair(sv, true));
  uint64_t deadline = tp__ipc_deadline();
  tp__wire q = tp__wire_make(TP_OP_CONNECT);
  tp_error_t err = tp__wire_send(fd, &q, sv[1], true, deadline);
  tp__ipc_fd_close(sv[1]);
  tp__recv_result r = TP_RECV_OK;
  if (err == TP_SUCCESS)
    r = tp__wire_recv(sv[0], h, backing, NULL, NULL, deadline);
  /* No answer, or no exporter's; or the pool's backing found no room in
   * this process's descriptor table. */
  if (err == TP_SUCCESS && r != TP_RECV_OK)
    err = r == TP_RECV_ERROR  ? tp__platform_fail(errno, "recvmsg")
          : r == TP_RECV_NOFD ? tp__platform_fail(EMFILE, "recvmsg")
                              : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && h->op != TP_OP_HELLO)
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp__wire_status(h->status, true);
  if (err != TP_SUCCESS) {
    if (*backing >= 0)
      close(*backing);
    tp__ipc_fd_close(sv[0]);
    return err;
  }
  *chan = sv[0];
  return TP_SUCCESS;
}

/* Whether a HELLO describes a pool the exporter's core could have made: a
 * power-of-two chunk no larger than a registry step, a range of whole
 * registry steps no larger than an address space, a size limit inside it,
 * a known allocation type and location. Checked before anything is sized
 * by these numbers. */
static bool hello_sane(const tp__wire *h) {
  const uint64_t step = (uint64_t)1 << TP_REGISTRY_SHIFT;
  return h->gran >= TP_GRANULE && h->gran <= step &&
         (h->gran & (h->gran - 1)) == 0 && h->va_size != 0 &&
         h->va_size % step == 0 && h->va_size <= TP_IPC_VA_MAX &&
         h->va_size <= SIZE_MAX && h->max_size <= h->va_size &&
         (h->alloc_type == TP_ALLOCATION_PINNED ||
          h->alloc_type == TP_ALLOCATION_MANAGED) &&
         (h->loc_type == TP_LOCATION_DEVICE ||
          (h->loc_type == TP_LOCATION_HOST_NUMA && h->loc_id >= 0));
}

/* The exporter's location as this process names it: its device by uuid, or
 * TP_LOCATION_INVISIBLE (id -2, as the driver's cudaInvalidDeviceId) where
 * that device is not one of this process's. */
static tp_error_t import_location(const tp__wire *h, tp_location_t *loc,
                                  int *device) {
  *device = -1;
  *loc = (tp_location_t){(tp_location_type_t)h->loc_type, h->loc_id, 0};
  if (h->loc_type == TP_LOCATION_HOST_NUMA)
    return TP_SUCCESS;
  int n = 0;
  TP_FORWARD(tp__platform->device_count(&n));
  for (int d = 0; d < n && d < TP_MAX_DEVICES && *device < 0; d++) {
    unsigned char uuid[16];
    if (tp__platform->device_uuid(d, uuid) == TP_SUCCESS &&
        memcmp(uuid, h->data, sizeof uuid) == 0)
      *device = d;
  }
  if (*device < 0)
    *loc = (tp_location_t){TP_LOCATION_INVISIBLE, -2, 0};
  else
    loc->id = *device;
  return TP_SUCCESS;
}

/* What an imported pool does where a pool of this process would act alone
 * (pool/pool.h). */
static const tp__pool_ops import_ops = {.free = import_free,
                                        .trim = import_trim,
                                        .set_access = import_set_access,
                                        .destroy = import_destroy,
                                        .fini = import_fini};

/* The importer's state for HELLO `h`: a range of the exporter's size in this
 * process, of the same chunk size. Consumes chan and backing. */
static tp_error_t import_state(const tp__wire *h, int chan, int backing,
                               const tp__mem_kind *kind, tp__ipc_import **out) {
  /* The chunk size first: the table is sized by it. */
  size_t gran = 0;
  uint64_t capacity = 0;
  tp_error_t err = tp__platform->mem_query(kind, &gran, &capacity);
  if (err == TP_SUCCESS && gran != h->gran)
    err = TP_ERROR_NOT_SUPPORTED; /* chunks this process cannot place */
  tp__ipc_import *m = err == TP_SUCCESS ? calloc(1, sizeof *m) : NULL;
  if (err == TP_SUCCESS && !m)
    err = TP_ERROR_OUT_OF_MEMORY;
  if (!m) {
    if (backing >= 0)
      close(backing);
    tp__ipc_fd_close(chan);
    return err;
  }
  m->fd = chan;
  pthread_mutex_init(&m->talk_mu, NULL);
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->rel_mu, NULL);
  pthread_cond_init(&m->rel_cv, NULL);
  m->pid = h->pid;
  m->serial = h->serial;
  m->gran = h->gran;
  m->va_size = h->va_size;
  m->nchunks = (size_t)(h->va_size / h->gran);
  m->npages = (m->nchunks + SLOT_PAGE - 1) / SLOT_PAGE;
  m->host_pool = h->loc_type == TP_LOCATION_HOST_NUMA;
  m->pages = calloc(m->npages, sizeof *m->pages);
  if (!m->pages)
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    err = tp__platform->reserve_imported(kind, (size_t)h->va_size,
                                         (size_t)1 << TP_REGISTRY_SHIFT,
                                         backing, &m->res, &m->base);
    backing = -1;
  }
  if (backing >= 0)
    close(backing);
  if (err != TP_SUCCESS) {
    import_free_state(m);
    return err;
  }
  *out = m;
  return TP_SUCCESS;
}

tp_error_t tp__ipc_import_pool(int fd, tp_pool_t *out) {
  int chan = -1, backing = -1;
  tp__wire h;
  TP_FORWARD(import_connect(fd, &chan, &h, &backing));
  tp_location_t loc;
  int device = -1;
  tp_error_t err = hello_sane(&h) ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = import_location(&h, &loc, &device);
  if (err != TP_SUCCESS) {
    if (backing >= 0)
      close(backing);
    tp__ipc_fd_close(chan);
    return err;
  }
  /* The range is reserved as memory of the device that holds the chunks,
   * or, where this process cannot see it, of the calling thread's device,
   * which is then the one given access. */
  if (device < 0 && loc.type == TP_LOCATION_INVISIBLE)
    device = tp__current_device();
  tp__mem_kind kind = {loc, (tp_allocation_type_t)h.alloc_type,
                       TP_HANDLE_POSIX_FD};
  if (loc.type == TP_LOCATION_INVISIBLE)
    kind.location = (tp_location_t){TP_LOCATION_DEVICE, device, 0};
  tp__ipc_import *m = NULL;
  TP_FORWARD(import_state(&h, chan, backing, &kind, &m));
  /* An imported pool exports nothing and reports the exporter's type,
   * size limit and (translated) location. */
  tp_pool_props_t props = {.alloc_type = (tp_allocation_type_t)h.alloc_type,
                           .location = loc,
                           .max_size = (size_t)h.max_size};
  tp__pool *p = NULL;
  err = tp__pool_new_imported(&props, &import_ops, &p);
  if (err != TP_SUCCESS) {
    import_free_state(m);
    return err;
  }
  p->imp = m;
  p->space.base = m->base;
  p->space.gran = (size_t)m->gran;
  p->space.va_size = (size_t)m->va_size;
  if (device >= 0)
    p->space.access[device] = TP_ACCESS_READ_WRITE;
  /* In the registry, so that tp_free_async finds the pool. */
  err = tp__registry_add(p->space.base, p->space.va_size, p);
  m->registered = err == TP_SUCCESS;
  if (err == TP_SUCCESS)
    err = tp__importers_add(p);
  if (err != TP_SUCCESS) {
    (void)tp__pool_destroy(p);
    return err;
  }
  *out = p->handle;
  return TP_SUCCESS;
}
