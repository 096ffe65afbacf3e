/* The replay's outputs besides its summary: the sampled timelines, drawn as
 * SVG line charts with axes and labels (one per trace, stacked), written as
 * counter tracks in the Chrome trace-event format that Perfetto and
 * chrome://tracing open, and the escaping of strings in its JSON. */
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

/* The length of the UTF-8 sequence at s, or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s) {
  size_t n;
  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    n = 2;
  else if (s[0] >= 0xe0 && s[0] <= 0xef)
    n = 3;
  else if (s[0] >= 0xf0 && s[0] <= 0xf4)
    n = 4;
  else
    return 0;
  /* Stops at a NUL, which is no continuation byte. */
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  /* Overlong three- and four-byte forms, surrogates, beyond U+10FFFF. */
  if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
      (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
    return 0;
  return n;
}

/* XML 1.0 allows no control character but tab, line feed and carriage
 * return, not even as a reference: a file name holding one shows '?'.
 * Bytes that are no UTF-8 (a name cut inside a character, a name of
 * another encoding) show U+FFFD, as in the JSON. */
static void xml_text(FILE *f, const char *str) {
  for (const unsigned char *s = (const unsigned char *)str; *s;) {
    unsigned char c = *s;
    size_t n = c < 0x80 ? 1 : utf8_len(s);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
      fputc('?', f);
    else if (c == '<')
      fputs("&lt;", f);
    else if (c == '>')
      fputs("&gt;", f);
    else if (c == '&')
      fputs("&amp;", f);
    else if (n == 0)
      fputs("&#xfffd;", f);
    else
      fwrite(s, 1, n, f);
    s += n ? n : 1;
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

/* One chart whose top edge is at y = top. */
static void chart(FILE *f, double top, const char *title,
                  const replay_timeline *tl) {
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
  fprintf(f, "<g transform=\"translate(0,%.0f)\">\n", top);
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
  fputs("</g>\n", f);
}

int replay_write_svg(FILE *f, const replay_chart *charts, size_t n) {
  const double W = 960, H = 480;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
          W, H * (double)(n ? n : 1));
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  for (size_t i = 0; i < n; i++)
    chart(f, H * (double)i, charts[i].title, charts[i].tl);
  fputs("</svg>\n", f);
  return ferror(f) ? -1 : 0;
}

void replay_json_string(FILE *f, const char *str) {
  for (const unsigned char *s = (const unsigned char *)str; *s;) {
    if (*s == '"' || *s == '\\') {
      fputc('\\', f);
      fputc(*s++, f);
    } else if (*s < 0x20 || *s == 0x7f) {
      fprintf(f, "\\u%04x", *s++);
    } else if (*s < 0x80) {
      fputc(*s++, f);
    } else {
      size_t n = utf8_len(s);
      if (n == 0) {
        fputs("\\ufffd", f);
        s++;
      } else {
        fwrite(s, 1, n, f);
        s += n;
      }
    }
  }
}

int replay_write_perfetto(FILE *f, const replay_chart *charts, size_t n) {
  /* Perfetto needs a time axis; a replay has none but the order of the
   * trace's operations, so one microsecond stands for one operation. The
   * file says so, and so does each process's name. */
  fputs("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"time_axis\":"
        "\"1 us = 1 operation of the trace (not time)\"},"
        "\"traceEvents\":[\n",
        f);
  for (size_t c = 0; c < n; c++) {
    const replay_timeline *tl = charts[c].tl;
    fprintf(f,
            "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%zu,"
            "\"args\":{\"name\":\"tidepool replay: ",
            c ? ",\n" : "", c + 1);
    replay_json_string(f, charts[c].title);
    fputs(" (1 us = 1 operation)\"}}", f);
    for (size_t i = 0; i < tl->n; i++)
      fprintf(f,
              ",\n{\"name\":\"pool memory (bytes)\",\"ph\":\"C\","
              "\"pid\":%zu,\"ts\":%.0f,\"args\":{\"used\":%llu,"
              "\"reserved\":%llu}}",
              c + 1, tl->v[i].x, (unsigned long long)tl->v[i].used,
              (unsigned long long)tl->v[i].reserved);
  }
  fputs("\n]}\n", f);
  return ferror(f) ? -1 : 0;
}
