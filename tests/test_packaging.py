"""A plain (non-editable) install ships the kernels and the CUDA source."""
import glob
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_contains_kernels_and_cuda_source_and_imports(tmp_path):
  subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                  "--no-build-isolation", "-w", str(tmp_path / "dist"), ROOT],
                 check=True, cwd=tmp_path)
  (wheel,) = glob.glob(str(tmp_path / "dist" / "jax_fp8-*.whl"))
  names = set(zipfile.ZipFile(wheel).namelist())
  want = [f"jax_fp8/pallas/{os.path.basename(p)}" for p in glob.glob(f"{ROOT}/pallas/*.py")]
  want += [f"jax_fp8/ffi/{os.path.basename(p)}"
           for pat in ("*.py", "*.cu") for p in glob.glob(f"{ROOT}/ffi/{pat}")]
  want += ["jax_fp8/__init__.py", "jax_fp8/primitive.py"]
  assert "jax_fp8/pallas/__init__.py" in want
  missing = [w for w in want if w not in names]
  assert not missing, f"wheel lacks {missing}"
  # Installed into a clean target and imported from elsewhere, the kernels
  # resolve inside the installed package, not from the source tree.
  target = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(target)
  code = ("import jax_fp8, jax_fp8.pallas, os; "
          "print(os.path.dirname(jax_fp8.pallas.__file__))")
  env = dict(os.environ, PYTHONPATH=str(target))
  out = subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env,
                       capture_output=True, text=True).stdout.strip()
  assert out == str(target / "jax_fp8" / "pallas")
