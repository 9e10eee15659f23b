struct ds4lab_capture_hooks {
    void (*token_begin)(void *ctx);
    void (*token_end)(void *ctx);
    void (*split_begin)(void *ctx, const char *call, int line);
    void (*split_end)(void *ctx);
    int (*token_active)(void *ctx);
    void *ctx;
};
