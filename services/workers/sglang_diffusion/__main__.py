from services.workers.sglang_diffusion.main import main

# Guarded: SGLang starts its scheduler processes with multiprocessing's spawn, which re-imports this module.
if __name__ == "__main__":
    main()
