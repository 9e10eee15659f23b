struct ds4lab_dry_state {
    unsigned long long signature;  /* a 64-bit hash of every deferred site's line, configuration and unmoved arguments */
    long long records;             /* deferred sites (launches and calls) */
    long long launches;            /* of those: kernel launches */
    long long moved;               /* of those: launches whose changing arguments went to a slot */
    unsigned long long slot_begin; /* bytes of the token's slot block before this segment */
    unsigned long long slot_end;   /* ... and after it */
    int error_line;                /* ds4's line of the first failure, 0 for none */
    char error[160];
};
