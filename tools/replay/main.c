/* tidepool-replay's command line: options (anywhere, --opt=value too),
 * loading the traces, the summary table with its notes and the figures of
 * repeated passes, JSON lines, the lag measurement of recorded traces, and
 * the plot and Perfetto files. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lag.h"
#include "replay.h"
#include "tidepool.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tidepool-replay [options] TRACE...\n"
      "Replays allocation traces through a tidepool pool, one stream per\n"
      "trace stream, and prints peak used and reserved memory. A TRACE is\n"
      "tidepool's CSV (traces/README.md), a PyTorch memory snapshot (the\n"
      "pickle of torch.cuda.memory._dump_snapshot) or an RMM logging\n"
      "adaptor CSV, gzip'd or not; the format is told by the content.\n\n"
      "  --platform host|cuda  the platform (default: TIDEPOOL_PLATFORM, or\n"
      "                        cuda where a GPU is usable, else host)\n"
      "  --threshold BYTES     the pool's release threshold (K/M/G/T;\n"
      "                        'max' keeps everything; default max)\n"
      "  --growth-slack PPM    how far above its peak in use the pool may\n"
      "                        grow by making chunks rather than moving\n"
      "                        them, in parts per million (0 to 1000000;\n"
      "                        default the pool's: 3906, or\n"
      "                        TIDEPOOL_GROWTH_SLACK's value where set;\n"
      "                        the output's last line says which)\n"
      "  --lag N               the device runs N operations behind the host:\n"
      "                        work queued on a stream completes once N more\n"
      "                        operations have been issued (0: an ideal\n"
      "                        device; default %u)\n"
      "  --passes N            replay each trace N times in a row through\n"
      "                        the same pool (1 to 100; default 1); the\n"
      "                        figures stay the first pass's, and a line\n"
      "                        under each row gives passes 2 to N, on the\n"
      "                        pool the first grew (the steady state of a\n"
      "                        training loop), and the ratio over every\n"
      "                        pass; --plot and --perfetto show the first\n"
      "                        pass\n"
      "  --measure-lag         replay nothing; print how far behind the\n"
      "                        device ran in a trace recorded with the\n"
      "                        completion column (traces/README.md)\n"
      "  --json                one JSON object per trace on stdout\n"
      "  --plot FILE.svg       used and reserved bytes over each trace, one\n"
      "                        chart per trace in one SVG file\n"
      "  --perfetto FILE.json  the same as counter tracks (one process per\n"
      "                        trace) for Perfetto or chrome://tracing; its\n"
      "                        time axis counts operations: 1 us stands for\n"
      "                        one operation of the trace\n"
      "  --against driver      on cuda, replay each trace through the\n"
      "                        driver's own pool (cuMemAllocFromPoolAsync)\n"
      "                        too, in the same run, and print both\n"
      "  --no-progress         no progress bar on stderr\n"
      "  -h, --help            this text\n"
      "Options may come before or after the traces, and --opt=value works.\n"
      "For a snapshot the replay also prints what PyTorch's own allocator\n"
      "reserved over the same trace. On the host platform the emulated\n"
      "device has 32 GiB unless TIDEPOOL_HOST_DEVICE_MEMORY says otherwise.\n"
      "Reading a trace may take at most 16 GiB of memory (the file, and what\n"
      "its operations or pickled values take), so that a small gzip'd file\n"
      "that decompresses to far more is refused, unless\n"
      "TIDEPOOL_REPLAY_MEMORY_LIMIT (bytes, K/M/G/T) says otherwise.\n"
      "A trace may use at most %d streams, the default one counted (each is\n"
      "a stream of the replay).\n",
      REPLAY_DEFAULT_LAG, TRACE_MAX_STREAMS);
}

static int parse_bytes(const char *s, uint64_t *out) {
  if (strcmp(s, "max") == 0) {
    *out = UINT64_MAX;
    return 0;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  /* strtoull skips white space and takes a sign: neither is a size. */
  if (end == s || !isdigit((unsigned char)*s) || errno)
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
  case 'T':
  case 't':
    shift = 40;
    end++;
    break;
  default: break;
  }
  if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

/* The trace's file name without its directory and known suffixes. */
static void trace_name(const char *path, char *out, size_t len) {
  const char *slash = strrchr(path, '/');
  snprintf(out, len, "%s", slash ? slash + 1 : path);
  static const char *const suffixes[] = {".gz", ".csv", ".pickle", ".pkl"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    size_t n = strlen(out), k = strlen(suffixes[i]);
    if (n > k && strcmp(out + n - k, suffixes[i]) == 0)
      out[n - k] = '\0';
  }
}

static int write_charts(const char *path, const replay_chart *charts, size_t n,
                        bool svg) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "tidepool-replay: %s: cannot write: %s\n", path,
            strerror(errno));
    return -1;
  }
  int rc = svg ? replay_write_svg(f, charts, n)
               : replay_write_perfetto(f, charts, n);
  if (fclose(f) != 0)
    rc = -1;
  if (rc)
    fprintf(stderr, "tidepool-replay: %s: write failed\n", path);
  return rc;
}

static double mib(uint64_t b) {
  return (double)b / 1048576.0;
}

/* Lines under a trace's row for what the table does not show. */
static void notes(const trace *t, const replay_result *r) {
  if (t->devices > 1)
    printf("  note: the snapshot has events on %d devices; only device %d's "
           "(the most) were replayed\n",
           t->devices, t->device);
  if (r->skipped_frees || t->double_allocs) {
    printf("  note:");
    if (r->skipped_frees)
      printf(" %zu free%s of no live allocation (never made, made before "
             "the trace began, or freed already) skipped%s",
             r->skipped_frees, r->skipped_frees == 1 ? "" : "s",
             t->double_allocs ? ";" : "");
    if (t->double_allocs)
      printf(" %zu allocation%s at an address still live (the earlier one "
             "stays live: the trace never frees it)",
             t->double_allocs, t->double_allocs == 1 ? "" : "s");
    printf("\n");
  }
  if (t->has_user && r->peak_used)
    printf("  your allocator: peak reserved %.1f MiB (ratio %.4f); "
           "tidepool: %.1f MiB (ratio %.4f)\n",
           mib(t->user_peak_reserved),
           (double)t->user_peak_reserved / (double)r->peak_used,
           mib(r->peak_reserved), r->ratio);
}

/* The passes after the first, where there were any: the JSON keys (maps
 * only for tidepool, whose counters the driver's pool lacks), or a line
 * under a row of the table. A run of one pass prints nothing more than it
 * always did. */
static double warm_ops_per_s(const replay_result *r) {
  return r->warm_seconds > 0 ? (double)r->warm_ops / r->warm_seconds : 0;
}

static void json_warm(const replay_result *r, unsigned passes, bool maps) {
  if (passes <= 1)
    return;
  printf(",\"passes\":%u,\"warm_ops\":%zu,\"warm_seconds\":%.6f,"
         "\"warm_ops_per_s\":%.0f,\"all_peak_reserved\":%llu,"
         "\"all_ratio\":%.4f",
         passes, r->warm_ops, r->warm_seconds, warm_ops_per_s(r),
         (unsigned long long)r->all_peak_reserved, r->all_ratio);
  if (maps)
    printf(",\"warm_maps\":%llu,\"warm_unmaps\":%llu",
           (unsigned long long)r->warm_maps,
           (unsigned long long)r->warm_unmaps);
}

/* "passes 2-2" would read as a range of one. */
static void passes_label(unsigned passes, char *out, size_t len) {
  if (passes == 2)
    snprintf(out, len, "pass 2");
  else
    snprintf(out, len, "passes 2-%u", passes);
}

static void json_result(const char *name, const char *platform, const trace *t,
                        const replay_result *r, const replay_options *o) {
  double ops_per_s = r->seconds > 0 ? (double)r->ops / r->seconds : 0;
  printf("{\"trace\":\"");
  replay_json_string(stdout, name);
  printf("\",\"format\":\"%s\",\"platform\":\"", trace_format_name(t->format));
  replay_json_string(stdout, platform);
  printf("\",\"lag\":%u,\"allocs\":%zu,\"ops\":%zu,\"skipped_frees\":%zu,"
         "\"double_allocs\":%zu,\"peak_used\":%llu,\"peak_reserved\":%llu,"
         "\"ratio\":%.4f,\"chunk_maps\":%llu,\"chunk_unmaps\":%llu,"
         "\"late_unmaps\":%llu,\"seconds\":%.6f,\"ops_per_s\":%.0f,"
         "\"threshold\":%llu,"
         "\"growth_slack\":%llu",
         o->lag, r->allocs, r->ops, r->skipped_frees, t->double_allocs,
         (unsigned long long)r->peak_used, (unsigned long long)r->peak_reserved,
         r->ratio, (unsigned long long)r->maps, (unsigned long long)r->unmaps,
         (unsigned long long)r->late_unmaps, r->seconds, ops_per_s,
         (unsigned long long)o->threshold, (unsigned long long)r->growth_slack);
  if (t->format == TRACE_FORMAT_SNAPSHOT)
    printf(",\"device\":%d,\"devices_with_events\":%d", t->device, t->devices);
  if (t->has_user)
    printf(",\"user_peak_reserved\":%llu,\"user_ratio\":%.4f",
           (unsigned long long)t->user_peak_reserved,
           r->peak_used ? (double)t->user_peak_reserved / (double)r->peak_used
                        : 0.0);
  json_warm(r, o->passes, true);
  printf("}\n");
}

static void measure(const char *name, const trace *t, bool json) {
  replay_lag_stats s;
  if (replay_measure_lag(t, &s) != 0) {
    if (json) {
      printf("{\"trace\":\"");
      replay_json_string(stdout, name);
      printf("\",\"lag_known\":0}\n");
    } else {
      printf("%-20s %9zu  no completion column (record with "
             "TIDEPOOL_TORCH_TRACE_COMPLETION; traces/README.md)\n",
             name, t->nops);
    }
    return;
  }
  if (json) {
    printf("{\"trace\":\"");
    replay_json_string(stdout, name);
    printf("\",\"ops\":%zu,\"lag_known\":%zu,\"lag_unknown\":%zu,"
           "\"lag_median\":%llu,\"lag_p90\":%llu,\"lag_p99\":%llu,"
           "\"lag_max\":%llu,\"lag_mean\":%.2f}\n",
           t->nops, s.known, s.unknown, (unsigned long long)s.median,
           (unsigned long long)s.p90, (unsigned long long)s.p99,
           (unsigned long long)s.max, s.mean);
  } else {
    printf("%-20s %9zu %9zu %7llu %7llu %7llu %7llu %8.1f\n", name, t->nops,
           s.known, (unsigned long long)s.median, (unsigned long long)s.p90,
           (unsigned long long)s.p99, (unsigned long long)s.max, s.mean);
  }
}

enum {
  OPT_PLATFORM = 256,
  OPT_THRESHOLD,
  OPT_GROWTH_SLACK,
  OPT_LAG,
  OPT_MEASURE_LAG,
  OPT_JSON,
  OPT_PLOT,
  OPT_PERFETTO,
  OPT_AGAINST,
  OPT_NO_PROGRESS,
  OPT_PASSES
};

/* The exit status: 1 where a trace failed, or where the figures could not
 * all be written (a full disk, a closed pipe): a run whose output was lost
 * must not pass for one that printed it. */
static int finished(int failures) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "tidepool-replay: writing the output failed\n");
    return 1;
  }
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  replay_options o = {.threshold = UINT64_MAX,
                      .growth_slack = UINT64_MAX,
                      .lag = REPLAY_DEFAULT_LAG,
                      .passes = 1,
                      .progress = true};
  bool json = false, against = false, measure_lag = false;
  replay_result driver;
  const char *plot = NULL, *perfetto = NULL;
  static const struct option longopts[] = {
      {"platform", required_argument, NULL, OPT_PLATFORM},
      {"threshold", required_argument, NULL, OPT_THRESHOLD},
      {"growth-slack", required_argument, NULL, OPT_GROWTH_SLACK},
      {"lag", required_argument, NULL, OPT_LAG},
      {"measure-lag", no_argument, NULL, OPT_MEASURE_LAG},
      {"json", no_argument, NULL, OPT_JSON},
      {"plot", required_argument, NULL, OPT_PLOT},
      {"perfetto", required_argument, NULL, OPT_PERFETTO},
      {"against", required_argument, NULL, OPT_AGAINST},
      {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
      {"passes", required_argument, NULL, OPT_PASSES},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    char *end;
    unsigned long v;
    switch (c) {
    case 'h': usage(stdout); return 0;
    case OPT_JSON: json = true; break;
    case OPT_NO_PROGRESS: o.progress = false; break;
    case OPT_MEASURE_LAG: measure_lag = true; break;
    case OPT_PLOT: plot = optarg; break;
    case OPT_PERFETTO: perfetto = optarg; break;
    case OPT_PLATFORM:
      if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0) {
        fprintf(stderr,
                "tidepool-replay: --platform takes host or cuda, "
                "not '%s'\n",
                optarg);
        return 2;
      }
      setenv("TIDEPOOL_PLATFORM", optarg, 1);
      break;
    case OPT_THRESHOLD:
      if (parse_bytes(optarg, &o.threshold) != 0) {
        fprintf(stderr, "tidepool-replay: bad --threshold '%s'\n", optarg);
        return 2;
      }
      break;
    case OPT_GROWTH_SLACK:
      errno = 0;
      v = strtoul(optarg, &end, 10);
      if (end == optarg || *end || *optarg == '-' || errno || v > 1000000) {
        fprintf(stderr,
                "tidepool-replay: --growth-slack takes parts per million from "
                "0 to 1000000, not '%s'\n",
                optarg);
        return 2;
      }
      o.growth_slack = v;
      break;
    case OPT_LAG:
      errno = 0;
      v = strtoul(optarg, &end, 10);
      if (end == optarg || *end || *optarg == '-' || errno || v > 1000000) {
        fprintf(stderr,
                "tidepool-replay: --lag takes a count of operations from 0 "
                "to 1000000, not '%s'\n",
                optarg);
        return 2;
      }
      o.lag = (unsigned)v;
      break;
    case OPT_PASSES:
      errno = 0;
      v = strtoul(optarg, &end, 10);
      /* strtoul would take leading white space and a sign. */
      if (!isdigit((unsigned char)*optarg) || *end || errno || v < 1 ||
          v > 100) {
        fprintf(stderr,
                "tidepool-replay: --passes takes a count of passes from 1 "
                "to 100, not '%s'\n",
                optarg);
        return 2;
      }
      o.passes = (unsigned)v;
      break;
    case OPT_AGAINST:
      if (strcmp(optarg, "driver") != 0) {
        fprintf(stderr, "tidepool-replay: --against takes 'driver'\n");
        return 2;
      }
      against = true;
      break;
    default:
      if (optopt == OPT_JSON || optopt == OPT_NO_PROGRESS ||
          optopt == OPT_MEASURE_LAG)
        fprintf(stderr, "tidepool-replay: option '%s' takes no value\n",
                argv[optind - 1]);
      else if (optopt >= OPT_PLATFORM)
        fprintf(stderr, "tidepool-replay: option '%s' needs a value\n",
                argv[optind - 1]);
      else if (optopt)
        fprintf(stderr, "tidepool-replay: unknown option '-%c'\n", optopt);
      else
        fprintf(stderr, "tidepool-replay: unknown option '%s'\n",
                argv[optind - 1]);
      fprintf(stderr, "(tidepool-replay --help lists the options)\n");
      return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "tidepool-replay: no trace given\n");
    usage(stderr);
    return 2;
  }
  int ntraces = argc - optind;
  char **paths = argv + optind;
  int failures = 0;
  if (measure_lag && (plot || perfetto)) {
    fprintf(stderr, "tidepool-replay: --measure-lag replays nothing: no "
                    "--plot or --perfetto to draw\n");
    return 2;
  }
  if (measure_lag) {
    if (!json)
      printf("%-20s %9s %9s %7s %7s %7s %7s %8s\n", "trace", "ops", "known",
             "median", "p90", "p99", "max", "mean");
    for (int i = 0; i < ntraces; i++) {
      char err[600], name[200];
      trace t;
      trace_name(paths[i], name, sizeof name);
      if (trace_load(&t, paths[i], err, sizeof err) != 0) {
        fprintf(stderr, "tidepool-replay: %s\n", err);
        failures++;
        continue;
      }
      measure(name, &t, json);
      trace_free(&t);
    }
    if (!json)
      printf("lag: operations issued since the newest one of the same stream "
             "known complete\n");
    return finished(failures);
  }
  o.progress = o.progress && isatty(STDERR_FILENO);
  /* The traces peak at 7 GiB; the host platform's emulated device gets room
   * for them unless told otherwise (untouched memory costs nothing). */
  /* Empty counts as unset, as the host platform reads it. */
  const char *devmem = getenv("TIDEPOOL_HOST_DEVICE_MEMORY");
  if (!devmem || !*devmem)
    setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "32G", 1);
  const char *platform = tp_platform_name();
  if (!platform) {
    fprintf(stderr, "tidepool-replay: no platform could start\n");
    return 1;
  }
  if (against && strcmp(platform, "cuda") != 0) {
    fprintf(stderr,
            "tidepool-replay: --against driver needs the cuda "
            "platform (this process runs on %s)\n",
            platform);
    return 2;
  }
  if (against)
    o.driver = &driver;
  replay_timeline *timelines = calloc((size_t)ntraces, sizeof *timelines);
  replay_chart *charts = calloc((size_t)ntraces, sizeof *charts);
  char(*titles)[300] = calloc((size_t)ntraces, sizeof *titles);
  if (!timelines || !charts || !titles) {
    fprintf(stderr, "tidepool-replay: out of memory\n");
    return 1;
  }
  size_t ncharts = 0;
  /* The slack the pools had, which TIDEPOOL_GROWTH_SLACK may have chosen:
   * the same for every trace of a run. */
  char slack_text[32] = "-";
  char passes_text[32];
  passes_label(o.passes, passes_text, sizeof passes_text);
  if (!json)
    printf("%-20s %9s %11s %11s %7s %7s %7s %7s %10s\n", "trace", "allocs",
           "peak used", "peak resv", "ratio", "maps", "unmaps", "late",
           "ops/s");
  for (int i = 0; i < ntraces; i++) {
    char err[600], name[200];
    trace t;
    trace_name(paths[i], name, sizeof name);
    if (trace_load(&t, paths[i], err, sizeof err) != 0) {
      fprintf(stderr, "tidepool-replay: %s\n", err);
      failures++;
      continue;
    }
    replay_timeline *tl = &timelines[ncharts];
    tl->n = 0;
    o.timeline = plot || perfetto ? tl : NULL;
    replay_result r;
    if (replay_trace(&o, &t, &r, err, sizeof err) != 0) {
      fprintf(stderr, "tidepool-replay: %s\n", err);
      failures++;
      trace_free(&t);
      continue;
    }
    snprintf(slack_text, sizeof slack_text, "%llu",
             (unsigned long long)r.growth_slack);
    double ops_per_s = r.seconds > 0 ? (double)r.ops / r.seconds : 0;
    if (json) {
      json_result(name, platform, &t, &r, &o);
    } else {
      printf("%-20s %9zu %9.1fMi %9.1fMi %7.4f %7llu %7llu %7llu %10.3g\n",
             name, r.allocs, mib(r.peak_used), mib(r.peak_reserved), r.ratio,
             (unsigned long long)r.maps, (unsigned long long)r.unmaps,
             (unsigned long long)r.late_unmaps, ops_per_s);
      if (o.passes > 1)
        printf("  %s: %.3g ops/s, %llu maps, %llu unmaps; ratio over every "
               "pass %.4f\n",
               passes_text, warm_ops_per_s(&r), (unsigned long long)r.warm_maps,
               (unsigned long long)r.warm_unmaps, r.all_ratio);
      notes(&t, &r);
    }
    if (against) {
      double dops =
          driver.seconds > 0 ? (double)driver.ops / driver.seconds : 0;
      if (json) {
        printf("{\"trace\":\"");
        replay_json_string(stdout, name);
        printf("\",\"allocator\":\"driver\",\"lag\":%u,"
               "\"allocs\":%zu,\"ops\":%zu,\"peak_used\":%llu,"
               "\"peak_reserved\":%llu,\"ratio\":%.4f,\"seconds\":%.6f,"
               "\"ops_per_s\":%.0f",
               o.lag, driver.allocs, driver.ops,
               (unsigned long long)driver.peak_used,
               (unsigned long long)driver.peak_reserved, driver.ratio,
               driver.seconds, dops);
        json_warm(&driver, o.passes, false);
        printf("}\n");
      } else {
        printf("%-20s %9zu %9.1fMi %9.1fMi %7.4f %7s %7s %7s %10.3g  "
               "(the driver's pool; tidepool %.1fx its speed)\n",
               "  driver", driver.allocs, mib(driver.peak_used),
               mib(driver.peak_reserved), driver.ratio, "-", "-", "-", dops,
               dops > 0 ? ops_per_s / dops : 0);
        double warm_dops = warm_ops_per_s(&driver);
        if (o.passes > 1)
          printf("  %s: %.3g ops/s (the driver's pool; tidepool %.1fx its "
                 "speed); ratio over every pass %.4f\n",
                 passes_text, warm_dops,
                 warm_dops > 0 ? warm_ops_per_s(&r) / warm_dops : 0,
                 driver.all_ratio);
      }
    }
    fflush(stdout);
    if (o.timeline) {
      char lagtxt[32] = "";
      if (o.lag)
        snprintf(lagtxt, sizeof lagtxt, ", lag %u", o.lag);
      snprintf(titles[ncharts], sizeof titles[ncharts],
               "%s: peak reserved / peak used = %.4f (%s%s)", name, r.ratio,
               platform, lagtxt);
      charts[ncharts] = (replay_chart){titles[ncharts], tl};
      ncharts++;
    }
    trace_free(&t);
  }
  if (!json) {
    printf("platform %s, lag %u, growth slack %s ppm; ratio = peak reserved / "
           "peak used; late = unmaps in the trace's second half",
           platform, o.lag, slack_text);
    if (o.passes > 1)
      printf(" (the first pass's, as is every figure of the row); %s: the "
             "trace again through the same pool",
             passes_text);
    printf("\n");
  }
  if (plot && ncharts && write_charts(plot, charts, ncharts, true) != 0)
    failures++;
  if (perfetto && ncharts &&
      write_charts(perfetto, charts, ncharts, false) != 0)
    failures++;
  for (int i = 0; i < ntraces; i++)
    free(timelines[i].v);
  free(timelines);
  free(charts);
  free(titles);
  return finished(failures);
}
