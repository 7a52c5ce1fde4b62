"""Where the metrics that bring their own models were published (their registry rows in
:mod:`capscore.scores.learned` and their model code in :mod:`capscore.scores.polos`, :mod:`~capscore.scores.deneb`
and :mod:`~capscore.scores.judge` cite them; this module imports nothing, so the rows stay torch-free)."""

POLOS_CITATION = ("Wada, Kaneda, Saito, Sugiura. Polos: Multimodal Metric Learning from Human Feedback for Image "
                  "Captioning. CVPR 2024 (arXiv:2402.18091); code github.com/keio-smilab24/Polos")
DENEB_CITATION = ("Matsuda, Wada, Sugiura. DENEB: A Hallucination-Robust Automatic Evaluation Metric for Image "
                  "Captioning. ACCV 2024 (arXiv:2409.19255); code github.com/Ka2ukiMatsuda/DENEB")
FLEUR_CITATION = ("Lee, Park, Kim, Kim, Kang. FLEUR: An Explainable Reference-Free Evaluation Metric for Image "
                  "Captioning Using a Large Multimodal Model. ACL 2024; code github.com/Yebin46/FLEUR")
EXPERT_CITATION = ("Kim, Kim, Jeong, Cho, Cho. EXPERT: An Explainable Image Captioning Evaluation Metric with "
                   "Structured Explanations. Findings of ACL 2025 (arXiv:2506.24016); code github.com/hjkim811/EXPERT")
