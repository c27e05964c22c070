/* The simulator's cost model (docs/simulator.md, "Cost model"): hardware
 * profiles, the shape of a model as the cost model sees it, and the time
 * of a forward step and of a KV transfer.
 *
 * A step is the work one forward pass of a node carries: decode
 * sequences (one token each) and prefill chunks, the two together on a
 * colocated node. Its time is the larger of its FLOPs over the compute
 * rate and its bytes (weights, KV read and written) over the memory
 * bandwidth, plus the tensor-parallel all-reduces and a fixed per-step
 * overhead. A transfer costs a fixed time plus its bytes over the link.
 * Units: seconds, bytes, FLOPs. */
#ifndef KVF_SIM_COST_H
#define KVF_SIM_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kv_format.h"
#include "kvf/model.h"
#include "kvf/status.h"

/* The most efficiency points (prompt or decode) a profile holds. */
#define KVF_SIM_EFF_POINTS_MAX 8

/* One GPU, the links of its node, and how close to the datasheet
 * software gets. */
typedef struct {
    char name[32];
    const char *source;        /* where the numbers come from (static text) */
    double hbm_bytes;          /* memory per GPU */
    double hbm_bw;             /* memory bandwidth per GPU, bytes/s */
    double flops;              /* dense bf16 tensor FLOP/s per GPU */
    double nvlink_bw;          /* NVLink per GPU and direction, bytes/s (tensor parallel) */
    double net_bw;             /* network per GPU (one NIC each), bytes/s (KV transfers) */
    double compute_eff;        /* fraction of flops prompt tokens reach (assumed) */
    double decode_compute_eff; /* the same for decode tokens (small batches: less) */
    double mem_eff;            /* fraction of hbm_bw a step reaches (assumed) */
    double kv_mem_fraction;    /* of HBM, what weights and the KV pool may take */
    double transfer_fixed_s;   /* a transfer's fixed cost */
    double step_overhead_s;    /* a forward step's fixed cost (launches, scheduling) */
    /* Measured on a CPU host (docs/simulator.md, "Profiles"); 0 in the
     * built-ins: each node on its own hardware, messages free. */
    double host_cpus;     /* CPUs every simulated node shares (0: not shared) */
    double host_load;     /* threads of other programs runnable on them, on average */
    double node_threads;  /* CPUs one node's step keeps busy */
    double msg_latency_s; /* one control message from a process to another */
    /* The host's last-level cache and the read bandwidth past it: while
     * other nodes of the host step too and all their weights do not fit
     * in llc_bytes together, each node's copy keeps an even share of it
     * and a step streams the rest of its weights at dram_bw instead of
     * hbm_bw (0: not modelled). */
    double llc_bytes, dram_bw;
    /* Prompt tokens' efficiency measured at several step sizes: at
     * prefill_eff_tokens[i] prompt tokens a step reaches prefill_eff[i]
     * of flops (tokens increasing; kvf_sim_prefill_eff between and past
     * them). 0 points: compute_eff at any size (the built-ins). */
    int n_prefill_eff;
    double prefill_eff_tokens[KVF_SIM_EFF_POINTS_MAX], prefill_eff[KVF_SIM_EFF_POINTS_MAX];
    /* Decode tokens' efficiency the same way, by the sequences a step
     * decodes: at decode_eff_seqs[i] of them, decode_eff[i] of flops
     * (kvf_sim_decode_eff). 0 points: decode_compute_eff at any batch. */
    int n_decode_eff;
    double decode_eff_seqs[KVF_SIM_EFF_POINTS_MAX], decode_eff[KVF_SIM_EFF_POINTS_MAX];
    /* The fraction of flops a decode token's attention reaches, over its
     * (query, key) pairs: on a CPU each pair costs a fixed time that no
     * matrix product hides (measured: the AVX2 host's serving contexts of
     * 300-1000 tokens made decode steps 20-30% longer than a decode_eff
     * fitted at 256). 0: the decode tokens' efficiency (the built-ins). */
    double attn_eff;
} kvf_sim_profile_t;

/* The efficiency of a step's prompt tokens, n of them: hw's measured
 * points interpolated linearly in log2(n), the end points' past them;
 * compute_eff without points. */
double kvf_sim_prefill_eff(const kvf_sim_profile_t *hw, double n);
/* The efficiency of a step's decode tokens, n sequences: as
 * kvf_sim_prefill_eff over hw's decode points; decode_compute_eff
 * without points. */
double kvf_sim_decode_eff(const kvf_sim_profile_t *hw, double n);

/* The built-in profile named name ("h100", "h200", "a100", any case, with
 * or without "-sxm"); false for another name. */
bool kvf_sim_profile_builtin(const char *name, kvf_sim_profile_t *profile_p);
/* The built-in names, comma-separated (for messages). */
const char *kvf_sim_profile_names(void);
/* A profile from a JSON file: {"base": "h200", "hbm_gb": ..., "hbm_tb_s": ...,
 * "tflops": ..., "nvlink_gb_s": ..., "net_gb_s": ..., "compute_eff": ...,
 * "decode_compute_eff": ..., "mem_eff": ..., "kv_mem_fraction": ...,
 * "transfer_fixed_us": ..., "step_overhead_us": ..., "host_cpus": ...,
 * "host_load": ..., "node_threads": ..., "msg_latency_us": ..., "llc_mb": ...,
 * "dram_gb_s": ..., "attn_eff": ..., "prefill_eff": [[tokens, eff], ...],
 * "decode_eff": [[seqs, eff], ...]}: fields absent
 * keep the base's (without a base: all but the efficiencies are
 * required). A problem is described in err. */
kvf_status_t kvf_sim_profile_load(const char *path, kvf_sim_profile_t *profile_p, char *err,
                                  size_t err_len);

/* A model as the cost model sees it, for one instance of tp GPUs. */
typedef struct {
    int n_layers, hidden, q_dim, vocab, tp;
    double weight_bytes;       /* every weight, at weight_elem_bytes each */
    double step_weight_bytes;  /* those a step streams: all but an untied input
                                * embedding table, of which it reads only its
                                * tokens' rows (kvf bench engine's roofline) */
    double layer_flops;        /* per token, the decoder layers' matrix products */
    double head_flops;         /* per token that gets logits: the lm_head */
    double attn_flops;         /* per (query, key) pair, every layer: QK^T and AV */
    double kv_bytes_per_token; /* kvf_kv_bytes_per_token at the KV format */
    kvf_kv_dtype_t kv_dtype;   /* that format */
    double act_bytes;          /* per token and all-reduce: the hidden state (bf16) */
} kvf_sim_model_t;

/* The shape of cfg with weights of weight_elem_bytes (2: bf16) and KV of
 * kv_dtype, split over tp GPUs. */
void kvf_sim_model_init(const kvf_model_config_t *cfg, double weight_elem_bytes,
                        kvf_kv_dtype_t kv_dtype, int tp, kvf_sim_model_t *model_p);

/* The KV blocks (block_size tokens) one instance holds once its weights
 * are in; 0 when they do not fit. */
uint32_t kvf_sim_capacity_blocks(const kvf_sim_profile_t *hw, const kvf_sim_model_t *m,
                                 uint32_t block_size);

/* What one forward step carries. */
typedef struct {
    uint32_t decode_seqs;     /* sequences producing a token */
    uint64_t decode_ctx;      /* the tokens they attend to, summed (their KV, read) */
    uint32_t prefill_tokens;  /* prompt tokens computed */
    uint64_t prefill_pairs;   /* (query, key) pairs of those (causal) */
    uint64_t prefill_kv_read; /* KV tokens the chunks read (what came before them) */
    uint32_t prefill_ends;    /* prompts whose last token this step computes (logits) */
} kvf_sim_step_t;

/* Adds to s a prefill chunk of n tokens after start tokens of its prompt
 * (cached or computed before); last: it ends the prompt. */
void kvf_sim_step_add_chunk(kvf_sim_step_t *s, uint32_t start, uint32_t n, bool last);

/* The FLOPs and bytes of s on one instance of m (all its GPUs). */
double kvf_sim_step_flops(const kvf_sim_model_t *m, const kvf_sim_step_t *s);
double kvf_sim_step_bytes(const kvf_sim_model_t *m, const kvf_sim_step_t *s);
/* The time of s: max(flops / compute, bytes / bandwidth) over the
 * instance's tp GPUs (the decode tokens' FLOPs at kvf_sim_decode_eff of
 * their number, their attention's at attn_eff when set, the prompt
 * tokens' at kvf_sim_prefill_eff of their number), plus the
 * all-reduces (two per layer, ring over NVLink) and the step overhead. */
double kvf_sim_step_time(const kvf_sim_profile_t *hw, const kvf_sim_model_t *m,
                         const kvf_sim_step_t *s);
/* The share of its CPUs a node's step gets on a shared host while
 * busy_threads threads of the simulated nodes compute (its own among
 * them): min(1, host_cpus / (busy_threads + host_load)); 1 when the
 * profile has no shared host. A step's time is kvf_sim_step_time over
 * this share. */
double kvf_sim_host_share(const kvf_sim_profile_t *hw, double busy_threads);
/* The time of a transfer of bytes between instances of tp GPUs, each GPU
 * shipping its share over its own NIC: fixed + bytes / (tp x net_bw). */
double kvf_sim_transfer_time(const kvf_sim_profile_t *hw, int tp, double bytes);

#endif
