from predictor.files import numba_cache_fallback

numba_cache_fallback()  # before any module compiles a cached numba function
