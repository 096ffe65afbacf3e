/* Loading a trace: the whole file through zlib (which reads plain files as
 * they are), its format told by its first bytes, then the reader of that
 * format. It stands above the readers: it calls them, and none calls it. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "trace_internal.h"

/* TIDEPOOL_REPLAY_MEMORY_LIMIT, or the default. */
static int memory_limit(const char *path, uint64_t *out, char *err,
                        size_t len) {
  const char *s = getenv("TIDEPOOL_REPLAY_MEMORY_LIMIT");
  *out = TRACE_DEFAULT_MEMORY_LIMIT;
  if (!s || !*s)
    return 0;
  uint64_t v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      break;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  unsigned shift = 0;
  if (p > s && *p) {
    const char *u = strchr("KMGT", *p >= 'a' ? *p - 'a' + 'A' : *p);
    shift = u ? 10u * (unsigned)(u - "KMGT" + 1) : 0;
    p += u != NULL;
  }
  if (p == s || *p || v == 0 || (shift && v > UINT64_MAX >> shift))
    return trace_failf(err, len,
                       "%s: TIDEPOOL_REPLAY_MEMORY_LIMIT=%s is not a byte "
                       "count (such as 512M or 32G)",
                       path, s);
  *out = v << shift;
  return 0;
}

/* Room in *buf for at least `more` bytes after the n it holds, and a NUL:
 * the capacity doubles, so that a file costs its size, not its square. */
static bool room_for(char **buf, size_t *cap, size_t n, size_t more) {
  if (*cap - n >= more)
    return true;
  size_t c = *cap;
  while (c - n < more) {
    if (c > SIZE_MAX / 4)
      return false;
    c *= 2;
  }
  char *b = realloc(*buf, c + 1);
  if (!b)
    return false;
  *buf = b;
  *cap = c;
  return true;
}

static size_t count_lines(const char *buf, size_t n) {
  size_t lines = 0;
  for (size_t i = 0; i < n; i++)
    lines += buf[i] == '\n';
  return lines;
}

#define READ_CHUNK ((size_t)1 << 20)
/* inflate counts in unsigned int: at most 1 GiB a call, so that a trace of
 * more than 4 GiB reads on. */
#define INFLATE_MAX ((size_t)1 << 30)

/* Inflates the gzip file f, whose first `have` bytes are already in `in`,
 * into *buf. Members concatenated one after the other are one stream, as
 * gzip itself reads them (zlib's gzread does too); anything else after the
 * last member is refused, where gzread skipped it without a word. */
static int inflate_file(FILE *f, const char *path, const trace_limit *l,
                        unsigned char *in, size_t have, char **buf, size_t *cap,
                        size_t *n, char *err, size_t errlen) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 15 + 16) != Z_OK) /* gzip only */
    return trace_failf(err, errlen, "%s: out of memory", path);
  z.next_in = in;
  z.avail_in = (uInt)have;
  unsigned long long at = 0; /* the file offset of in[0] */
  bool between = false;      /* after a whole member */
  int rc = 0;
  while (rc == 0) {
    if (z.avail_in < 2 && !feof(f)) {
      /* Two bytes at least, so that a member's magic can be told. */
      size_t keep = z.avail_in;
      at += (unsigned long long)(z.next_in - in);
      memmove(in, z.next_in, keep);
      have = keep + fread(in + keep, 1, READ_CHUNK - keep, f);
      if (ferror(f)) {
        rc = trace_failf(err, errlen, "%s: cannot read: %s", path,
                         strerror(errno));
        break;
      }
      z.next_in = in;
      z.avail_in = (uInt)have;
    }
    if (between) {
      if (z.avail_in == 0)
        break; /* the end of the file after a whole member */
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        rc = trace_failf(err, errlen,
                         "%s: data after the end of the gzip stream at byte "
                         "%llu that is not another gzip member (after line "
                         "%zu)",
                         path, at + (unsigned long long)(z.next_in - in),
                         count_lines(*buf, *n));
        break;
      }
      inflateReset(&z);
      between = false;
    }
    /* One byte past the limit tells that the file goes past it. */
    uint64_t left = l->limit - l->held - *n;
    left += left < UINT64_MAX;
    if (!room_for(buf, cap, *n, left < 1u << 16 ? (size_t)left : 1u << 16)) {
      rc = trace_failf(err, errlen, "%s: out of memory", path);
      break;
    }
    size_t room = *cap - *n < INFLATE_MAX ? *cap - *n : INFLATE_MAX;
    room = room < left ? room : (size_t)left;
    z.next_out = (unsigned char *)*buf + *n;
    z.avail_out = (uInt)room;
    int zr = z.avail_in ? inflate(&z, Z_NO_FLUSH) : Z_BUF_ERROR;
    *n += room - z.avail_out;
    if (*n > l->limit - l->held) {
      char why[200];
      trace_limit_fail(l, "decompresses to", why, sizeof why);
      rc = trace_failf(err, errlen,
                       "%s: %s, by line %zu (compressed byte %llu): a gzip "
                       "bomb, or a trace to read with a higher limit",
                       path, why, count_lines(*buf, *n) + 1,
                       at + (unsigned long long)(z.next_in - in));
    } else if (zr == Z_STREAM_END)
      between = true;
    else if (zr == Z_BUF_ERROR && z.avail_in == 0 && feof(f))
      rc = trace_failf(err, errlen,
                       "%s: corrupt or truncated gzip after line %zu: the "
                       "file ends inside a gzip member",
                       path, count_lines(*buf, *n));
    else if (zr == Z_MEM_ERROR)
      rc = trace_failf(err, errlen, "%s: out of memory", path);
    else if (zr != Z_OK && zr != Z_BUF_ERROR)
      rc = trace_failf(err, errlen,
                       "%s: corrupt or truncated gzip after line %zu: %s", path,
                       count_lines(*buf, *n), z.msg ? z.msg : "damaged data");
  }
  inflateEnd(&z);
  return rc;
}

/* The whole file, decompressed when it begins with gzip's magic bytes and
 * as it is otherwise. The message of a damaged gzip stream counts the whole
 * lines read before the damage. */
static int slurp(const char *path, trace_limit *l, char **out, size_t *outlen,
                 char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0)
    return trace_failf(err, errlen, "%s: cannot open: %s", path,
                       strerror(errno));
  if (S_ISDIR(st.st_mode))
    return trace_failf(err, errlen, "%s: is a directory, not a trace", path);
  char why[200];
  if ((uint64_t)st.st_size > l->limit - l->held) {
    trace_limit_fail(l, "is", why, sizeof why);
    return trace_failf(err, errlen, "%s: a file of %lld bytes %s", path,
                       (long long)st.st_size, why);
  }
  FILE *f = fopen(path, "rb");
  if (!f)
    return trace_failf(err, errlen, "%s: cannot open: %s", path,
                       strerror(errno));
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap + 1);
  unsigned char *in = malloc(READ_CHUNK);
  int rc = buf && in ? 0 : trace_failf(err, errlen, "%s: out of memory", path);
  size_t have = rc == 0 ? fread(in, 1, READ_CHUNK, f) : 0;
  if (rc == 0 && have >= 2 && in[0] == 0x1f && in[1] == 0x8b) {
    rc = inflate_file(f, path, l, in, have, &buf, &cap, &n, err, errlen);
  } else if (rc == 0) {
    while (have > 0) {
      if (have > l->limit - l->held - n) {
        /* The file grew since its size was read. */
        trace_limit_fail(l, "holds", why, sizeof why);
        rc = trace_failf(err, errlen, "%s: %s", path, why);
        break;
      }
      if (!room_for(&buf, &cap, n, have)) {
        rc = trace_failf(err, errlen, "%s: out of memory", path);
        break;
      }
      memcpy(buf + n, in, have);
      n += have;
      have = fread(in, 1, READ_CHUNK, f);
    }
  }
  if (rc == 0 && ferror(f))
    rc = trace_failf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
  fclose(f);
  free(in);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  trace_charge(l, n);
  buf[n] = '\0';
  *out = buf;
  *outlen = n;
  return 0;
}

/* The line (from 1) of the first carriage return that a line feed does not
 * follow, or 0: RMM's first fields are never parsed, so such a byte there
 * would pass unseen. */
static size_t lone_cr_line(const char *data, size_t n) {
  size_t line = 1;
  for (size_t i = 0; i + 1 < n; i++) {
    if (data[i] == '\n')
      line++;
    else if (data[i] == '\r' && data[i + 1] != '\n')
      return line;
  }
  return 0;
}

/* The two headers of tidepool's CSV, which tell that format; the one with
 * the fifth column also tells its reader that the column is there. */
static const char csv_header[] = TRACE_CSV_HEADER;
static const char csv_header_done[] = TRACE_CSV_HEADER_DONE;

int trace_load(trace *t, const char *path, char *err, size_t len) {
  memset(t, 0, sizeof *t);
  char *data = NULL;
  size_t n = 0;
  trace_limit limit = {0};
  if (memory_limit(path, &limit.limit, err, len) != 0 ||
      slurp(path, &limit, &data, &n, err, len) != 0)
    return -1;
  t->path = strdup(path);
  int rc = t->path ? 0 : trace_failf(err, len, "%s: out of memory", path);
  static const char rmm_header[] = "Thread,Time,Action,Pointer,Size,Stream";
  size_t first = strcspn(data, "\r\n");
  bool snapshot = n > 0 && (unsigned char)data[0] == 0x80;
  bool rmm =
      first == sizeof rmm_header - 1 && strncmp(data, rmm_header, first) == 0;
  /* Lines end with a line feed (a carriage return before it is allowed):
   * a carriage return alone would hide the rest of the file in line 1, and
   * in an RMM log's first fields, which are never parsed, pass unseen. */
  size_t cr = 0;
  if (rmm)
    cr = lone_cr_line(data, n);
  else if (!snapshot && first + 1 < n && data[first] == '\r' &&
           data[first + 1] != '\n')
    cr = 1;
  if (rc != 0) {
    /* reported */
  } else if (n == 0) {
    rc = trace_failf(err, len, "%s: empty file", path);
  } else if (cr) {
    rc = trace_failf(err, len,
                     "%s:%zu: a carriage return without a line feed ends the "
                     "line; lines must end with a line feed",
                     path, cr);
  } else if (snapshot) {
    t->format = TRACE_FORMAT_SNAPSHOT;
    rc = trace_read_snapshot(t, (const unsigned char *)data, n, &limit, err,
                             len);
  } else if ((first == sizeof csv_header - 1 &&
              strncmp(data, csv_header, first) == 0) ||
             (first == sizeof csv_header_done - 1 &&
              strncmp(data, csv_header_done, first) == 0)) {
    t->format = TRACE_FORMAT_CSV;
    rc = trace_read_csv(t, data, n, &limit, err, len);
  } else if (rmm) {
    t->format = TRACE_FORMAT_RMM;
    rc = trace_read_rmm(t, data, n, &limit, err, len);
  } else {
    rc = trace_failf(err, len,
                     "%s:1: expected the header '%s' (tidepool), '%s' (RMM's "
                     "logging adaptor) or a PyTorch memory snapshot (a pickle)",
                     path, csv_header, rmm_header);
  }
  if (rc == 0 && t->nops == 0)
    rc = trace_failf(err, len, "%s: no allocations or frees in the file", path);
  free(data);
  if (rc != 0)
    trace_free(t);
  return rc;
}
