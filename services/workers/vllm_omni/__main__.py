from services.workers.vllm_omni.main import main

# Guarded: vLLM-Omni starts its stage processes with multiprocessing's spawn, which re-imports this module.
if __name__ == "__main__":
    main()
