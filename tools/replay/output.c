/* The replay's outputs besides its summary: the sampled timeline, drawn as
 * an SVG line chart with axes and labels, and written as counter tracks in
 * the Chrome trace-event format that Perfetto and chrome://tracing open. */
#include <stdlib.h>
#include <string.h>

#include "replay.h"

void replay_timeline_add(replay_timeline *tl, double x, uint64_t used,
                         uint64_t reserved) {
  if (tl->n == tl->cap) {
    size_t cap = tl->cap ? tl->cap * 2 : 1024;
    replay_sample *v = realloc(tl->v, cap * sizeof *v);
    if (!v)
      return; /* a shorter plot, not a failed replay */
    tl->v = v;
    tl->cap = cap;
  }
  tl->v[tl->n++] = (replay_sample){x, used, reserved};
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about n ticks. */
static double tick_step(double range, int n) {
  double raw = range / n, p = 1;
  while (p * 10 <= raw)
    p *= 10;
  while (p > raw)
    p /= 10;
  double m = raw / p;
  return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<')
      fputs("&lt;", f);
    else if (*s == '>')
      fputs("&gt;", f);
    else if (*s == '&')
      fputs("&amp;", f);
    else
      fputc(*s, f);
  }
}

static void polyline(FILE *f, const replay_timeline *tl, bool reserved,
                     double x0, double y0, double w, double h, double xmax,
                     double ymax, const char *color) {
  fprintf(f,
          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
          "points=\"",
          color);
  for (size_t i = 0; i < tl->n; i++) {
    /* Values are drawn in MiB, as the axis says. */
    double v =
        (double)(reserved ? tl->v[i].reserved : tl->v[i].used) / 1048576.0;
    fprintf(f, "%.1f,%.1f ", x0 + tl->v[i].x / xmax * w, y0 + h - v / ymax * h);
  }
  fputs("\"/>\n", f);
}

int replay_write_svg(FILE *f, const char *title, const replay_timeline *tl) {
  const double W = 960, H = 480, L = 80, R = 30, T = 50, B = 60;
  double w = W - L - R, h = H - T - B;
  double xmax = 1, ymax = 1;
  for (size_t i = 0; i < tl->n; i++) {
    if (tl->v[i].x > xmax)
      xmax = tl->v[i].x;
    if ((double)tl->v[i].reserved / 1048576.0 > ymax)
      ymax = (double)tl->v[i].reserved / 1048576.0;
  }
  ymax *= 1.05;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
          W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f,
          "<text x=\"%.0f\" y=\"28\" font-size=\"16\" "
          "text-anchor=\"middle\">",
          W / 2);
  xml_text(f, title);
  fputs("</text>\n", f);
  double ys = tick_step(ymax, 6), xs = tick_step(xmax, 8);
  for (double y = 0; y <= ymax; y += ys) {
    double py = T + h - y / ymax * h;
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" "
            "stroke=\"#ddd\"/>\n<text x=\"%.0f\" y=\"%.1f\" "
            "text-anchor=\"end\">%g</text>\n",
            L, py, L + w, py, L - 6, py + 4, y);
  }
  for (double x = 0; x <= xmax; x += xs) {
    double px = L + x / xmax * w;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" "
            "stroke=\"#333\"/>\n<text x=\"%.1f\" y=\"%.0f\" "
            "text-anchor=\"middle\">%g</text>\n",
            px, T + h, px, T + h + 5, px, T + h + 20, x);
  }
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
          "fill=\"none\" stroke=\"#333\"/>\n",
          L, T, w, h);
  fprintf(f,
          "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">operation "
          "of the trace</text>\n",
          L + w / 2, H - 15);
  fprintf(f,
          "<text transform=\"translate(20,%.0f) rotate(-90)\" "
          "text-anchor=\"middle\">MiB</text>\n",
          T + h / 2);
  polyline(f, tl, true, L, T, w, h, xmax, ymax, "#e67e22");
  polyline(f, tl, false, L, T, w, h, xmax, ymax, "#2c7bb6");
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"3\" "
          "fill=\"#e67e22\"/><text x=\"%.0f\" y=\"%.0f\">reserved "
          "(mapped chunks)</text>\n",
          L + 12, T + 14, L + 32, T + 19);
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"3\" "
          "fill=\"#2c7bb6\"/><text x=\"%.0f\" y=\"%.0f\">used (bytes "
          "asked for)</text>\n",
          L + 12, T + 32, L + 32, T + 37);
  fputs("</svg>\n", f);
  return ferror(f) ? -1 : 0;
}

int replay_write_perfetto(FILE *f, const char *name,
                          const replay_timeline *tl) {
  fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n", f);
  fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,"
             "\"args\":{\"name\":\"tidepool replay: ");
  for (const char *s = name; *s; s++)
    if (*s != '"' && *s != '\\' && (unsigned char)*s >= 0x20)
      fputc(*s, f);
  fputs("\"}}", f);
  /* One microsecond per trace operation: Perfetto needs a time axis. */
  for (size_t i = 0; i < tl->n; i++)
    fprintf(f,
            ",\n{\"name\":\"pool memory (bytes)\",\"ph\":\"C\","
            "\"pid\":1,\"ts\":%.0f,\"args\":{\"used\":%llu,"
            "\"reserved\":%llu}}",
            tl->v[i].x, (unsigned long long)tl->v[i].used,
            (unsigned long long)tl->v[i].reserved);
  fputs("\n]}\n", f);
  return ferror(f) ? -1 : 0;
}
