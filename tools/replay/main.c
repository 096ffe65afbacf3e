/* tidepool-replay's command line: options, loading the traces, the summary
 * table, JSON lines, and the plot and Perfetto files of the last trace. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay.h"
#include "tidepool.h"

static void usage(FILE *f) {
  fputs(
      "usage: tidepool-replay [options] TRACE.csv.gz...\n"
      "Replays allocation traces through a tidepool pool, one stream per\n"
      "trace stream, and prints peak used and reserved memory.\n\n"
      "  --platform host|cuda  the platform (default: TIDEPOOL_PLATFORM, or\n"
      "                        cuda where a GPU is usable, else host)\n"
      "  --threshold BYTES     the pool's release threshold (K/M/G suffixes;\n"
      "                        'max' keeps everything; default max)\n"
      "  --json                one JSON object per trace on stdout\n"
      "  --plot FILE.svg       the used/reserved timeline of the last trace\n"
      "  --perfetto FILE.json  the same as Chrome trace-event counters\n"
      "  --against driver      on cuda, replay each trace through the "
      "driver's\n"
      "                        own pool (cuMemAllocFromPoolAsync) too, in the\n"
      "                        same run, and print both\n"
      "  --no-progress         no progress bar on stderr\n"
      "On the host platform the emulated device has 32 GiB unless\n"
      "TIDEPOOL_HOST_DEVICE_MEMORY says otherwise.\n"
      "  -h, --help            this text\n",
      f);
}

static int parse_bytes(const char *s, uint64_t *out) {
  if (strcmp(s, "max") == 0) {
    *out = UINT64_MAX;
    return 0;
  }
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || *s == '-')
    return -1;
  unsigned shift = 0;
  switch (*end) {
  case 'K':
  case 'k':
    shift = 10;
    end++;
    break;
  case 'M':
  case 'm':
    shift = 20;
    end++;
    break;
  case 'G':
  case 'g':
    shift = 30;
    end++;
    break;
  default: break;
  }
  if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The trace's name without directory and .csv.gz. */
static void trace_name(const char *path, char *out, size_t len) {
  snprintf(out, len, "%s", base_name(path));
  char *dot = strstr(out, ".csv");
  if (dot)
    *dot = '\0';
}

static int write_file(const char *path, const char *title,
                      const replay_timeline *tl, bool svg) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "tidepool-replay: %s: cannot write: %s\n", path,
            strerror(errno));
    return -1;
  }
  int rc = svg ? replay_write_svg(f, title, tl)
               : replay_write_perfetto(f, title, tl);
  if (fclose(f) != 0)
    rc = -1;
  if (rc)
    fprintf(stderr, "tidepool-replay: %s: write failed\n", path);
  return rc;
}

int main(int argc, char **argv) {
  replay_options o = {.threshold = UINT64_MAX, .progress = true};
  bool json = false, against = false;
  replay_result driver;
  const char *plot = NULL, *perfetto = NULL;
  int first = argc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = i + 1 < argc;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--json") == 0) {
      json = true;
    } else if (strcmp(a, "--no-progress") == 0) {
      o.progress = false;
    } else if (strcmp(a, "--platform") == 0 && has_value) {
      const char *p = argv[++i];
      if (strcmp(p, "host") != 0 && strcmp(p, "cuda") != 0) {
        fprintf(stderr, "tidepool-replay: --platform takes host or cuda\n");
        return 2;
      }
      setenv("TIDEPOOL_PLATFORM", p, 1);
    } else if (strcmp(a, "--threshold") == 0 && has_value) {
      if (parse_bytes(argv[++i], &o.threshold) != 0) {
        fprintf(stderr, "tidepool-replay: bad --threshold '%s'\n", argv[i]);
        return 2;
      }
    } else if (strcmp(a, "--plot") == 0 && has_value) {
      plot = argv[++i];
    } else if (strcmp(a, "--against") == 0 && has_value) {
      if (strcmp(argv[++i], "driver") != 0) {
        fprintf(stderr, "tidepool-replay: --against takes 'driver'\n");
        return 2;
      }
      against = true;
    } else if (strcmp(a, "--perfetto") == 0 && has_value) {
      perfetto = argv[++i];
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "tidepool-replay: unknown or incomplete option '%s'\n",
              a);
      usage(stderr);
      return 2;
    } else {
      first = i;
      break;
    }
  }
  if (first >= argc) {
    usage(stderr);
    return 2;
  }
  o.progress = o.progress && isatty(STDERR_FILENO);
  /* The traces peak at 7 GiB; the host platform's emulated device gets room
   * for them unless told otherwise (untouched memory costs nothing). */
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "32G", 0);
  const char *platform = tp_platform_name();
  if (!platform) {
    fprintf(stderr, "tidepool-replay: no platform could start\n");
    return 1;
  }
  replay_timeline tl = {0};
  if (plot || perfetto)
    o.timeline = &tl;
  if (against && strcmp(platform, "cuda") != 0) {
    fprintf(stderr,
            "tidepool-replay: --against driver needs the cuda "
            "platform (this process runs on %s)\n",
            platform);
    return 2;
  }
  if (against)
    o.driver = &driver;
  if (!json)
    printf("%-20s %9s %11s %11s %7s %7s %7s %10s\n", "trace", "allocs",
           "peak used", "peak resv", "ratio", "maps", "unmaps", "ops/s");
  int failures = 0;
  char last[400] = "";
  for (int i = first; i < argc; i++) {
    char err[512], name[200];
    trace t;
    trace_name(argv[i], name, sizeof name);
    if (trace_load(&t, argv[i], err, sizeof err) != 0) {
      fprintf(stderr, "tidepool-replay: %s\n", err);
      failures++;
      continue;
    }
    tl.n = 0;
    replay_result r;
    if (replay_trace(&o, &t, &r, err, sizeof err) != 0) {
      fprintf(stderr, "tidepool-replay: %s\n", err);
      failures++;
      trace_free(&t);
      continue;
    }
    double ops_per_s = r.seconds > 0 ? (double)r.ops / r.seconds : 0;
    if (json)
      printf("{\"trace\":\"%s\",\"platform\":\"%s\",\"allocs\":%zu,"
             "\"ops\":%zu,\"skipped_frees\":%zu,\"peak_used\":%llu,"
             "\"peak_reserved\":%llu,\"ratio\":%.4f,\"chunk_maps\":%llu,"
             "\"chunk_unmaps\":%llu,\"seconds\":%.6f,\"ops_per_s\":%.0f,"
             "\"threshold\":%llu}\n",
             name, platform, r.allocs, r.ops, r.skipped_frees,
             (unsigned long long)r.peak_used,
             (unsigned long long)r.peak_reserved, r.ratio,
             (unsigned long long)r.maps, (unsigned long long)r.unmaps,
             r.seconds, ops_per_s, (unsigned long long)o.threshold);
    else
      printf("%-20s %9zu %9.1fMi %9.1fMi %7.4f %7llu %7llu %10.3g\n", name,
             r.allocs, (double)r.peak_used / 1048576.0,
             (double)r.peak_reserved / 1048576.0, r.ratio,
             (unsigned long long)r.maps, (unsigned long long)r.unmaps,
             ops_per_s);
    if (against) {
      double dops =
          driver.seconds > 0 ? (double)driver.ops / driver.seconds : 0;
      if (json)
        printf("{\"trace\":\"%s\",\"allocator\":\"driver\","
               "\"allocs\":%zu,\"ops\":%zu,\"peak_used\":%llu,"
               "\"peak_reserved\":%llu,\"ratio\":%.4f,\"seconds\":%.6f,"
               "\"ops_per_s\":%.0f}\n",
               name, driver.allocs, driver.ops,
               (unsigned long long)driver.peak_used,
               (unsigned long long)driver.peak_reserved, driver.ratio,
               driver.seconds, dops);
      else
        printf("%-20s %9zu %9.1fMi %9.1fMi %7.4f %7s %7s %10.3g  "
               "(the driver's pool; tidepool %.1fx its speed)\n",
               "  driver", driver.allocs, (double)driver.peak_used / 1048576.0,
               (double)driver.peak_reserved / 1048576.0, driver.ratio, "-", "-",
               dops, dops > 0 ? ops_per_s / dops : 0);
    }
    fflush(stdout);
    snprintf(last, sizeof last, "%s: peak reserved / peak used = %.4f (%s)",
             name, r.ratio, platform);
    trace_free(&t);
  }
  if (!json)
    printf("platform %s; chunks of %s; ratio = peak reserved / peak used\n",
           platform, "the platform's granularity");
  if (plot && tl.n && write_file(plot, last, &tl, true) != 0)
    failures++;
  if (perfetto && tl.n && write_file(perfetto, last, &tl, false) != 0)
    failures++;
  free(tl.v);
  return failures ? 1 : 0;
}
