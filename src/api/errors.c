/* tp_error_name and tp_error_string, generated from the one list of errors
 * in tidepool.h. */
#include "tidepool.h"

TP_API const char *tp_error_name(tp_error_t error) {
  switch (error) {
#define TP_ERROR_NAME_(name, value, text)                                      \
  case name: return #name;
    TP_ERROR_LIST(TP_ERROR_NAME_)
#undef TP_ERROR_NAME_
  }
  return "TP_ERROR_UNKNOWN";
}

TP_API const char *tp_error_string(tp_error_t error) {
  switch (error) {
#define TP_ERROR_STRING_(name, value, text)                                    \
  case name: return text;
    TP_ERROR_LIST(TP_ERROR_STRING_)
#undef TP_ERROR_STRING_
  }
  return "unknown error code";
}
