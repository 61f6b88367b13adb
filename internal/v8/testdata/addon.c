// A small N-API addon for addon.js: sonde_addon_call calls a JavaScript
// function back (napi_call_function), sonde_addon_burn burns in C. Built
// by the tests with the system compiler against Node's headers; N-API's
// ABI lets one build load into every Node.
#define NAPI_VERSION 8
#include <node_api.h>

// sonde_addon_spin is the C leaf: a loop no compiler folds away.
__attribute__((noinline)) unsigned long sonde_addon_spin(unsigned long n) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

// sonde_addon_call(fn, n) returns fn(n).
__attribute__((noinline)) napi_value sonde_addon_call(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2], global, result = NULL;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 2 ||
      napi_get_global(env, &global) != napi_ok ||
      napi_call_function(env, global, argv[0], 1, &argv[1], &result) != napi_ok) {
    napi_throw_error(env, NULL, "sonde_addon_call(fn, n)");
    return NULL;
  }
  return result;
}

// sonde_addon_burn(n) returns sonde_addon_spin(n).
__attribute__((noinline)) napi_value sonde_addon_burn(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], result = NULL;
  double n = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 ||
      napi_get_value_double(env, argv[0], &n) != napi_ok) {
    napi_throw_error(env, NULL, "sonde_addon_burn(n)");
    return NULL;
  }
  napi_create_double(env, (double)sonde_addon_spin((unsigned long)n), &result);
  return result;
}

NAPI_MODULE_INIT() {
  napi_value fn;
  napi_create_function(env, "call", NAPI_AUTO_LENGTH, sonde_addon_call, NULL, &fn);
  napi_set_named_property(env, exports, "call", fn);
  napi_create_function(env, "burn", NAPI_AUTO_LENGTH, sonde_addon_burn, NULL, &fn);
  napi_set_named_property(env, exports, "burn", fn);
  return exports;
}
